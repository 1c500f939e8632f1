//! Client connections served over HTTP/1.1 by foldgate itself, one task each: read a
//! request head, call the service with the request (its body read off the socket as the
//! service polls it), write the response as its body yields, and go again while the
//! connection may stay open.
//!
//! hyper's server ran these connections before; it did the same in more layers (a
//! dispatcher, a role, buffered I/O and the tower-to-hyper glue, each polled on every
//! step). What it did that clients see is kept: the framing rules (`super::inbound`),
//! `100 Continue` when the body is first read, the request dropped when its client goes
//! away before the answer, pipelined requests, upgrades (the WebSocket handshake hands
//! the socket over), and HTTP/2 with prior knowledge (handed to hyper's HTTP/2 server).

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::codec::{Decoded, Decoder, Framing, WireError};
use super::inbound::{self, Answering, HeadError, RequestHead};
use super::outgoing::Outgoing;
use crate::http::body::{BoxError, ProxyBody};
use crate::http::deadline;
use crate::http::error::ProxyError;
use crate::http::linger::{self, UnreadBody};
use crate::http::tags::{self, Tags};

/// Bytes asked of the socket per read of a request head.
const READ_SIZE: usize = 16 * 1024;
/// A request body of known length up to this size is read whole before the service
/// gets it, as one piece; a longer one, or a chunked one, goes in pieces as they come.
const WHOLE_BODY: u64 = 1024 * 1024;
/// What an HTTP/2 client with prior knowledge sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How the connections of one listener are served.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The longest wait for a request head, from the connection's start or the end of
    /// the previous response; an idle connection closes after it.
    pub head_timeout: Duration,
    /// The most bytes a lingering close reads (see `crate::http::linger`).
    pub max_drain: u64,
}

/// A client's request, boxed: it passes through the layers, the router and the handler
/// as a pointer, not as its few hundred bytes copied at every call.
pub type ClientRequest = Box<Request<ClientBody>>;

/// What serves the requests of a connection: the layers around the router, answering
/// every request (errors are answers too). Its future is held where the connection
/// awaits it, not boxed: a request's future is kilobytes, copied whole into a box.
pub trait ClientService: Clone + Send + 'static {
    /// The answer to `request`.
    fn call(
        &mut self,
        request: ClientRequest,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + use<Self>;
}

/// A client's socket, shared by its connection's task, the request body being read
/// and, after an upgrade, the new protocol.
#[derive(Debug)]
struct Socket {
    stream: TcpStream,
    /// The connection's read buffer, handed back by a request body at its end (with
    /// any bytes read past it).
    returned: Mutex<Option<BytesMut>>,
}

impl Socket {
    /// Reads into the spare capacity of `buf`.
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let room = buf.capacity() - buf.len();
        self.poll_read_with(cx, room, || self.stream.try_read_buf(buf))
    }

    /// Polls `read`, a read of at most `room` bytes from the socket, until it reads or
    /// fails.
    ///
    /// A read that leaves some of the room unfilled has drained the socket, and clears
    /// its readiness with it, as tokio's own `AsyncRead` does: the next look at the
    /// socket (the watch for a client that leaves, the next request's head) waits for
    /// the next event instead of making a system call that finds nothing. An end of
    /// stream stays ready (tokio never clears a closed state).
    fn poll_read_with(
        &self,
        cx: &mut Context<'_>,
        room: usize,
        mut read: impl FnMut() -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            let mut done = None;
            // `try_io` clears the readiness it was given when the closure says WouldBlock.
            let result = self.stream.try_io(Interest::READABLE, || {
                let n = read()?;
                done = Some(n);
                match n > 0 && n < room {
                    true => Err(io::ErrorKind::WouldBlock.into()),
                    false => Ok(n),
                }
            });
            match (result, done) {
                (Ok(n), _) => return Poll::Ready(Ok(n)),
                (Err(e), Some(n)) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Poll::Ready(Ok(n));
                }
                (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => {}
                (Err(e), _) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Writes from `bufs`, in one system call when the socket takes them all.
    fn poll_write(&self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }

    /// Sends FIN: nothing more comes from foldgate.
    fn shutdown_write(&self) -> io::Result<()> {
        socket2::SockRef::from(&self.stream).shutdown(std::net::Shutdown::Write)
    }

    fn returned(&self) -> MutexGuard<'_, Option<BytesMut>> {
        self.returned.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Serves one client connection until it closes, fails, is idle past the head timeout,
/// or `stop` is cancelled (then the request in flight is answered, with
/// `connection: close`, and the connection ends).
pub async fn serve<S: ClientService>(
    stream: TcpStream,
    mut service: S,
    settings: Settings,
    stop: CancellationToken,
) {
    let socket = Arc::new(Socket { stream, returned: Mutex::new(None) });
    let mut buf = BytesMut::new();
    let mut first = true;
    // How much a read of the next request head asks for: enough for the last request
    // whole and some growth (agents resend a conversation a little longer each time), so
    // that its body comes in the same read and is not copied to a larger buffer.
    let mut read_size = READ_SIZE;
    let lingering = loop {
        let head = next_head(&socket, &mut buf, read_size, first, settings.head_timeout, &stop);
        let head = match head.await {
            Next::Head(head) => head,
            Next::Http2 => return serve_http2(socket, buf, service, stop).await,
            Next::Closed => break false,
            Next::Refused(error) => {
                tracing::debug!(%error, "refused a request head");
                let (status, message) = (error.status(), error.to_string());
                let response = ProxyError::MalformedRequest { status, message }.into_response();
                let answering = Answering {
                    version: http::Version::HTTP_11,
                    head: false,
                    trailers: false,
                    keep_alive: false,
                };
                let mut watch = Watch::off();
                let _ = respond(&socket, response, answering, &mut buf, &mut watch).await;
                // The client may still be sending (a head too large): it reads the
                // answer before the close.
                break true;
            }
        };
        first = false;
        let RequestHead { request, framing, keep_alive, expects_continue } = head;
        read_size = match framing {
            Framing::Length(length) if length <= WHOLE_BODY => {
                // At most `WHOLE_BODY`: fits in `usize`.
                (length as usize + length as usize / 4 + 4096).max(READ_SIZE)
            }
            _ => READ_SIZE,
        };
        let answering = Answering::of(&request, keep_alive);
        let (mut request, mut watch) = if framing == Framing::Length(0) {
            (request.map(|()| ClientBody::Empty), Watch::on(false))
        } else {
            let body = RequestBody {
                socket: socket.clone(),
                buf: std::mem::take(&mut buf),
                decoder: Decoder::new(framing),
                continue_left: if expects_continue { CONTINUE.len() } else { 0 },
                done: false,
            };
            (request.map(|()| ClientBody::Wire(body)), Watch::on(true))
        };
        let upgrade = match request.headers().contains_key(http::header::UPGRADE) {
            true => {
                let (sender, receiver) = oneshot::channel();
                request.extensions_mut().insert(OnUpgrade(Arc::new(Mutex::new(Some(receiver)))));
                Some(sender)
            }
            false => None,
        };

        // The answer, unless the client leaves first (then the request is dropped, and
        // with it whatever it was waiting for upstream).
        let mut call = pin!(service.call(Box::new(request)));
        let response = poll_fn(|cx| match call.as_mut().poll(cx) {
            Poll::Ready(response) => Poll::Ready(Some(response)),
            Poll::Pending if watch.poll_gone(&socket, &mut buf, cx) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        })
        .await;
        let Some(response) = response else { break false };
        let unread = response.extensions().get::<UnreadBody>().is_some();
        let keep_alive = answering.keep_alive && !unread && !stop.is_cancelled();
        let answering = Answering { keep_alive, ..answering };
        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        let Ok(kept) = respond(&socket, response, answering, &mut buf, &mut watch).await else {
            break false;
        };
        if switching && let Some(sender) = upgrade {
            let io = ClientIo { prefix: std::mem::take(&mut buf).freeze(), socket };
            if let Err(io) = sender.send(io) {
                let _ = io.socket.shutdown_write();
            }
            return;
        }
        if unread {
            break true;
        }
        // The body's end gave the read buffer back; without it (the body was not read
        // to its end) the connection cannot carry another request.
        if !watch.take_back(&socket, &mut buf) || !kept || stop.is_cancelled() {
            break false;
        }
    };
    let io = ClientIo { prefix: Bytes::new(), socket };
    if lingering {
        linger::close(io, settings.max_drain).await;
    } else {
        let _ = io.socket.shutdown_write();
    }
}

/// Makes room in `buf` for `additional` more bytes. An empty buffer that is too small
/// takes back its whole allocation when the last request's head and body no longer
/// hold a part of it (no copy, and memory still in the cache), else is replaced, not
/// grown: growing would copy the bytes already consumed from it (`BytesMut` keeps them
/// before its start until its allocation is reused).
fn room(buf: &mut BytesMut, additional: usize) {
    if buf.is_empty() && buf.capacity() < additional {
        if !buf.try_reclaim(additional) {
            *buf = BytesMut::with_capacity(additional);
        }
    } else {
        buf.reserve(additional);
    }
}

/// What came first on the connection. Lives on the stack for a moment: the head is not
/// boxed.
#[allow(clippy::large_enum_variant)]
enum Next {
    Head(RequestHead),
    /// The HTTP/2 preface.
    Http2,
    /// The client closed (or stayed idle past the timeout, or the server is stopping)
    /// with no request begun.
    Closed,
    Refused(HeadError),
}

/// Reads the next request head into `buf`, with room for `read_size` bytes; `first`: the
/// connection's first bytes, which may be the HTTP/2 preface.
async fn next_head(
    socket: &Socket,
    buf: &mut BytesMut,
    read_size: usize,
    first: bool,
    timeout: Duration,
    stop: &CancellationToken,
) -> Next {
    // A pipelined request already read needs no wait.
    if !buf.is_empty() && !first {
        match inbound::parse_request_head(buf) {
            Ok(Some(head)) => return Next::Head(head),
            Ok(None) => {}
            Err(error) => return Next::Refused(error),
        }
    }
    let idle = buf.is_empty();
    let read = async {
        loop {
            // Room for the whole next request when starting one; a head begun only
            // needs room to go on.
            let spare = buf.capacity() - buf.len();
            if (buf.is_empty() && spare < read_size) || spare < 1024 {
                room(buf, read_size);
            }
            match poll_fn(|cx| socket.poll_read(cx, buf)).await {
                Ok(0) | Err(_) => return Next::Closed,
                Ok(_) => {}
            }
            if first {
                let seen = buf.len().min(PREFACE.len());
                if buf[..seen] == PREFACE[..seen] {
                    if seen == PREFACE.len() {
                        return Next::Http2;
                    }
                    continue;
                }
            }
            match inbound::parse_request_head(buf) {
                Ok(Some(head)) => return Next::Head(head),
                Ok(None) => {}
                Err(error) => return Next::Refused(error),
            }
        }
    };
    let timed = deadline::timeout(timeout, read);
    tokio::select! {
        biased;
        next = timed => next.unwrap_or(Next::Closed),
        () = stop.cancelled(), if idle => Next::Closed,
    }
}

/// Watches a connection for its client leaving while a request is served: a read that
/// finds the end of the stream. Bytes read instead (a pipelined request) stay in the
/// buffer, and the watch ends. Nothing is read while the request body is still being
/// read by the service; its own read sees the client leave.
struct Watch {
    /// The request body has the read buffer.
    body_out: bool,
    /// Not watching (nothing to watch, or bytes of the next request came).
    off: bool,
}

impl Watch {
    fn on(body_out: bool) -> Self {
        Self { body_out, off: false }
    }

    fn off() -> Self {
        Self { body_out: false, off: true }
    }

    /// Takes the read buffer back from a body that has ended; false while the body has
    /// it.
    fn take_back(&mut self, socket: &Socket, buf: &mut BytesMut) -> bool {
        if self.body_out {
            match socket.returned().take() {
                Some(returned) => {
                    *buf = returned;
                    self.body_out = false;
                }
                None => return false,
            }
        }
        true
    }

    /// True when the client has gone: the connection reads its end (or fails).
    fn poll_gone(&mut self, socket: &Socket, buf: &mut BytesMut, cx: &mut Context<'_>) -> bool {
        if self.off || !self.take_back(socket, buf) {
            return false;
        }
        loop {
            if socket.stream.poll_read_ready(cx).is_pending() {
                return false;
            }
            let mut probe = [0u8; 512];
            match socket.stream.try_read(&mut probe) {
                Ok(0) => return true,
                Ok(read) => {
                    buf.extend_from_slice(&probe[..read]);
                    self.off = true;
                    return false;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return true,
            }
        }
    }
}

/// Writes `response` to the client; `Ok(true)` when the connection may carry another
/// request as far as the response goes, `Err` when the client left or the body failed
/// (the connection must close, abruptly).
async fn respond(
    socket: &Socket,
    response: Response<ProxyBody>,
    answering: Answering,
    buf: &mut BytesMut,
    watch: &mut Watch,
) -> Result<bool, ()> {
    let (mut parts, mut body) = response.into_parts();
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>().map(|r| r.as_bytes());
    let tags = parts.extensions.get::<Tags>();
    let head = inbound::response_head(
        parts.status,
        reason,
        &mut parts.headers,
        tags,
        answering,
        body.is_end_stream(),
        body.size_hint().exact(),
    );
    let mut out = Outgoing::new(head.sending, Bytes::from(head.bytes));
    poll_fn(|cx| {
        loop {
            // Whatever the body has ready goes out with the head, in one write.
            while !out.ended && out.queued() < READ_SIZE {
                match Pin::new(&mut body).poll_frame(cx) {
                    Poll::Pending => break,
                    Poll::Ready(None) => out.end(None).map_err(drop)?,
                    Poll::Ready(Some(Err(error))) => {
                        tracing::debug!(%error, "a response body failed: the connection closes");
                        return Poll::Ready(Err(()));
                    }
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => {
                            out.data(data).map_err(drop)?;
                            if body.is_end_stream() {
                                out.end(None).map_err(drop)?;
                            }
                        }
                        Err(frame) => out.end(frame.into_trailers().ok()).map_err(drop)?,
                    },
                }
            }
            if out.is_empty() {
                if out.ended {
                    return Poll::Ready(Ok(head.keep_alive));
                }
                if watch.poll_gone(socket, buf, cx) {
                    return Poll::Ready(Err(()));
                }
                return Poll::Pending;
            }
            let mut slices = [IoSlice::new(&[]); 16];
            let count = out.slices(&mut slices);
            match socket.poll_write(cx, &slices[..count]) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Err(())),
                Poll::Ready(Ok(written)) => out.advance(written),
                Poll::Pending => {
                    if watch.poll_gone(socket, buf, cx) {
                        return Poll::Ready(Err(()));
                    }
                    return Poll::Pending;
                }
            }
        }
    })
    .await
}

/// Hands the connection to hyper's HTTP/2 server (a client that speaks HTTP/2 with
/// prior knowledge), the preface in front.
async fn serve_http2<S: ClientService>(
    socket: Arc<Socket>,
    buf: BytesMut,
    service: S,
    stop: CancellationToken,
) {
    let io = TokioIo::new(ClientIo { prefix: buf.freeze(), socket });
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let answer = service.clone().call(Box::new(request.map(ClientBody::Hyper)));
        async move {
            let mut answer = answer.await;
            tags::into_headers(&mut answer);
            Ok::<_, Infallible>(answer)
        }
    });
    let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(io, service);
    let mut connection = pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "an HTTP/2 connection ended with an error");
            }
        }
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// The body of a client's request: read by foldgate's own HTTP/1.1 server, or by
/// hyper's HTTP/2 server.
#[derive(Debug)]
pub enum ClientBody {
    /// No body (no `Content-Length`, or zero).
    Empty,
    /// Read off an HTTP/1.1 connection as it is polled.
    Wire(RequestBody),
    /// An HTTP/2 stream's.
    Hyper(hyper::body::Incoming),
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::Wire(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::Hyper(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Wire(body) => body.is_end_stream(),
            Self::Hyper(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::Wire(body) => body.size_hint(),
            Self::Hyper(body) => body.size_hint(),
        }
    }
}

/// A request body read off the client's connection as it is polled.
#[derive(Debug)]
pub struct RequestBody {
    socket: Arc<Socket>,
    /// The connection's read buffer, the body's first bytes in front.
    buf: BytesMut,
    decoder: Decoder,
    /// Bytes of `100 Continue` still to write before the first read.
    continue_left: usize,
    /// Ended: the buffer went back to the connection (or the body failed).
    done: bool,
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    /// The chunks are malformed, or the connection closed before the body's end.
    #[error("request body: {0}")]
    Message(#[from] WireError),
    /// Reading the connection failed.
    #[error("request body: {0}")]
    Io(#[from] io::Error),
}

impl RequestBody {
    fn finish(&mut self) {
        self.done = true;
        *self.socket.returned() = Some(std::mem::take(&mut self.buf));
    }

    /// Writes what is left of `100 Continue`.
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.continue_left > 0 {
            let from = CONTINUE.len() - self.continue_left;
            let written = ready!(self.socket.poll_write(cx, &[IoSlice::new(&CONTINUE[from..])]))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.continue_left -= written;
        }
        Poll::Ready(Ok(()))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            // A body of known, moderate length goes out whole, as one piece.
            let whole = this.decoder.remaining().filter(|&left| left <= WHOLE_BODY);
            let short = match whole {
                Some(left) => (this.buf.len() as u64) < left,
                None => this.buf.is_empty(),
            };
            let decoded = match short {
                true => Ok(Decoded::More),
                false => this.decoder.decode(&mut this.buf),
            };
            match decoded {
                Ok(Decoded::More) => {
                    if let Err(error) = ready!(this.poll_continue(cx)) {
                        this.done = true;
                        return Poll::Ready(Some(Err(error.into())));
                    }
                    // Room for the rest (the part read with the head moves along when
                    // the buffer must grow; the connection sizes its reads so that it
                    // seldom must).
                    match whole {
                        // At most `WHOLE_BODY`: fits in `usize`.
                        Some(left) => {
                            let missing = left as usize - this.buf.len();
                            room(&mut this.buf, missing);
                        }
                        None if this.buf.capacity() == this.buf.len() => {
                            room(&mut this.buf, READ_SIZE);
                        }
                        None => {}
                    }
                    match ready!(this.socket.poll_read(cx, &mut this.buf)) {
                        Ok(0) => {
                            this.done = true;
                            return Poll::Ready(Some(Err(WireError::Incomplete.into())));
                        }
                        Ok(_) => {}
                        Err(error) => {
                            this.done = true;
                            return Poll::Ready(Some(Err(error.into())));
                        }
                    }
                }
                Ok(Decoded::Data(data)) => {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::Trailers(trailers)) => {
                    this.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Err(error) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(error.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

/// A request extension: the connection, once the response to an upgrade (`101
/// Switching Protocols`) has been written.
#[derive(Debug, Clone)]
pub struct OnUpgrade(Arc<Mutex<Option<oneshot::Receiver<ClientIo>>>>);

/// The upgrade did not happen (the response was not `101`, or the connection failed
/// first).
#[derive(Debug, thiserror::Error)]
#[error("the connection was not upgraded")]
pub struct NotUpgraded;

impl OnUpgrade {
    /// Takes the upgrade handle out of `request`; `None` when it asks for no upgrade or
    /// came over HTTP/2.
    pub fn take<B>(request: &mut Request<B>) -> Option<Self> {
        request.extensions_mut().remove::<Self>()
    }

    /// The connection, after the `101` response went out.
    pub async fn upgraded(self) -> Result<ClientIo, NotUpgraded> {
        let receiver = self.0.lock().ok().and_then(|mut r| r.take()).ok_or(NotUpgraded)?;
        receiver.await.map_err(|_| NotUpgraded)
    }
}

/// A client's connection as a byte stream, the bytes already read from it in front: an
/// upgraded connection, an HTTP/2 one, or one closing.
#[derive(Debug)]
pub struct ClientIo {
    prefix: Bytes,
    socket: Arc<Socket>,
}

impl AsyncRead for ClientIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let take = self.prefix.len().min(out.remaining());
            out.put_slice(&self.prefix[..take]);
            self.prefix.advance(take);
            return Poll::Ready(Ok(()));
        }
        // SAFETY-free: `try_read` fills an initialized slice.
        let unfilled = out.initialize_unfilled();
        let room = unfilled.len();
        let socket = &self.socket;
        let read = ready!(socket.poll_read_with(cx, room, || socket.stream.try_read(unfilled)))?;
        out.advance(read);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.socket.poll_write(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.socket.poll_write(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.socket.shutdown_write())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use tower::Service;

    /// A `tower` service answering every request, as a [`ClientService`].
    #[derive(Debug, Clone)]
    struct Tower<S>(S);

    impl<S> ClientService for Tower<S>
    where
        S: Service<Request<ClientBody>, Response = Response<ProxyBody>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        fn call(
            &mut self,
            request: ClientRequest,
        ) -> impl Future<Output = Response<ProxyBody>> + Send + use<S> {
            let answer = self.0.call(*request);
            async move {
                match answer.await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
        }
    }
    use crate::http::body::full;

    /// A server of the `tower` service `service` on a loopback port; its stop token.
    async fn listen<S>(
        service: S,
        head_timeout: Duration,
    ) -> (std::net::SocketAddr, CancellationToken)
    where
        Tower<S>: ClientService,
    {
        let service = Tower(service);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let settings = Settings { head_timeout, max_drain: 1024 };
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(serve(stream, service.clone(), settings, token.clone()));
            }
        });
        (addr, stop)
    }

    /// Everything the server sends until it closes (within 10 s).
    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out));
        read.await.expect("closed within 10 s").unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_read_buffer_is_taken_back_once_the_last_request_let_go_of_it() {
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        buf.extend_from_slice(&[b'x'; 2048]);
        let start = buf.as_ptr();
        // The last request's head and body, parts of the same allocation.
        let request = buf.split_to(2048).freeze();
        room(&mut buf, READ_SIZE);
        assert!(buf.capacity() >= READ_SIZE);
        assert_ne!(buf.as_ptr(), start, "a part is still held: a new buffer");
        drop(request);
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        buf.extend_from_slice(&[b'y'; 2048]);
        let start = buf.as_ptr();
        drop(buf.split_to(2048).freeze());
        room(&mut buf, READ_SIZE);
        assert_eq!(buf.as_ptr(), start, "nothing holds it: the same allocation, from its start");
        assert!(buf.capacity() >= READ_SIZE && buf.is_empty());
        // A larger room than the allocation: a new, larger buffer.
        room(&mut buf, 4 * READ_SIZE);
        assert!(buf.capacity() >= 4 * READ_SIZE);
    }

    #[tokio::test]
    async fn an_idle_connection_closes_after_the_head_timeout() {
        let hello = tower::service_fn(|_: Request<ClientBody>| async {
            Ok::<_, Infallible>(Response::new(full("hello")))
        });
        let (addr, _stop) = listen(hello, Duration::from_millis(300)).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let started = Instant::now();
        let answer = read_to_close(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("hello"), "{answer}");
        assert!(started.elapsed() >= Duration::from_millis(300), "kept open while idle");
        // A head begun and never finished gets the same bound.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\nhost: a").await.unwrap();
        assert_eq!(read_to_close(&mut stream).await, "");
    }

    #[tokio::test]
    async fn stopping_closes_idle_connections_and_answers_the_busy_one_with_close() {
        let calls = Arc::new(AtomicUsize::new(0));
        let count = calls.clone();
        let slow = tower::service_fn(move |_: Request<ClientBody>| {
            count.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(Response::new(full("done")))
            }
        });
        let (addr, stop) = listen(slow, Duration::from_secs(30)).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        assert_eq!(read_to_close(&mut idle).await, "", "the idle connection closes at once");
        let answer = read_to_close(&mut busy).await;
        assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
        assert!(answer.ends_with("done"), "{answer}");
    }

    #[tokio::test]
    async fn an_upgrade_hands_the_socket_over_after_the_101() {
        let upgrade = tower::service_fn(|mut request: Request<ClientBody>| async move {
            let on_upgrade = OnUpgrade::take(&mut request).expect("an upgrade handle");
            tokio::spawn(async move {
                let mut io = on_upgrade.upgraded().await.unwrap();
                let mut word = [0u8; 4];
                io.read_exact(&mut word).await.unwrap();
                io.write_all(&word).await.unwrap();
                io.shutdown().await.unwrap();
            });
            let mut response = Response::new(full(""));
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            response.headers_mut().insert(http::header::UPGRADE, "echo".parse().unwrap());
            response.headers_mut().insert(http::header::CONNECTION, "upgrade".parse().unwrap());
            Ok::<_, Infallible>(response)
        });
        let (addr, _stop) = listen(upgrade, Duration::from_secs(30)).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // The first bytes of the new protocol come with the request itself.
        stream
            .write_all(b"GET / HTTP/1.1\r\nupgrade: echo\r\nconnection: upgrade\r\n\r\nping")
            .await
            .unwrap();
        let answer = read_to_close(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 101 Switching Protocols\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nping"), "{answer}");
    }

    /// A connected pair: foldgate's side as a [`Socket`], and the client's stream.
    async fn socket_pair() -> (Socket, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        (Socket { stream, returned: Mutex::new(None) }, client)
    }

    /// Polls `socket` for a read once, without waiting.
    fn read_once(socket: &Socket, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        socket.poll_read(&mut Context::from_waker(std::task::Waker::noop()), buf)
    }

    #[tokio::test]
    async fn a_read_that_drains_the_socket_leaves_it_waiting_for_the_next_bytes() {
        let (socket, mut client) = socket_pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = BytesMut::with_capacity(4096);
        let read = poll_fn(|cx| socket.poll_read(cx, &mut buf)).await.unwrap();
        assert_eq!(read, 18);
        // Drained: no stale readiness sends the next look into a read that finds nothing.
        let mut noop = Context::from_waker(std::task::Waker::noop());
        assert!(socket.stream.poll_read_ready(&mut noop).is_pending());
        // The next bytes wake it, and an end of stream after them is still seen.
        client.write_all(b"more").await.unwrap();
        client.shutdown().await.unwrap();
        let read = poll_fn(|cx| socket.poll_read(cx, &mut buf)).await.unwrap();
        assert_eq!(&buf[18..18 + read], b"more");
        let end = poll_fn(|cx| socket.poll_read(cx, &mut buf)).await.unwrap();
        assert_eq!(end, 0);
    }

    #[tokio::test]
    async fn a_read_that_fills_the_buffer_keeps_the_socket_ready() {
        let (socket, mut client) = socket_pair().await;
        client.write_all(&[b'x'; 100]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut buf = BytesMut::with_capacity(64);
        let first = poll_fn(|cx| socket.poll_read(cx, &mut buf)).await.unwrap();
        assert_eq!(first, buf.len());
        // Bytes may be left: the next read takes them at once.
        buf.reserve(4096);
        let Poll::Ready(rest) = read_once(&socket, &mut buf) else { panic!("not ready") };
        assert_eq!(first + rest.unwrap(), 100);
    }
}
