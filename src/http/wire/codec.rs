//! HTTP/1.1 messages towards the upstream as bytes: the request head foldgate writes and
//! how its body is framed, the response head it reads and how that body is delimited
//! (a length, chunks, or the connection's close). No I/O here: the property tests and
//! the fuzz target feed these functions bytes.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Uri, Version};

/// Most header lines a response head (or a trailer section) may have.
pub const MAX_HEADERS: usize = 100;
/// Room left in a parsed head's header map for the headers foldgate adds before
/// passing it on (an answer's request ids when it carries no tags, and the tags when
/// HTTP/2 puts them in the map, see `crate::http::tags`; a request's id and length),
/// so that adding them does not grow the map.
pub const ADDED_HEADERS: usize = 10;
/// Largest response head (status line and headers) accepted: about what hyper's client
/// buffers for one.
pub const MAX_HEAD: usize = 400 * 1024;
/// Longest chunk-size line (size and extensions) accepted.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Largest trailer section accepted.
const MAX_TRAILERS: usize = 64 * 1024;

/// Why a response could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The status line or a header is malformed.
    #[error("invalid response head: {0}")]
    Head(&'static str),
    /// The head did not end within [`MAX_HEAD`] bytes.
    #[error("response head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// `Content-Length` is not one number.
    #[error("invalid content-length in the response")]
    ContentLength,
    /// The chunked body is malformed.
    #[error("invalid chunked body: {0}")]
    Chunk(&'static str),
    /// The connection closed before the head or the body ended.
    #[error("connection closed before the response ended")]
    Incomplete,
}

/// How a body goes on the wire (a request's to the upstream, a response's to a client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sending {
    /// Exactly this many bytes (`Content-Length`, or no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked {
        /// The trailers of the body go out (a response's only when its client sent
        /// `TE: trailers`).
        trailers: bool,
    },
    /// Raw bytes until the connection closes (a response to an HTTP/1.0 client whose
    /// size is unknown).
    UntilClose,
}

/// Which of the headers that frame a message or its connection a head carries, found in
/// one pass over its names (most heads carry few of them; a lookup each would hash
/// every name).
#[derive(Debug, Clone, Copy)]
pub(super) struct Framers(u64);

impl Framers {
    /// `Transfer-Encoding`, `Content-Length`, `Connection`, `Expect`, `Date`, in bit order.
    const NAMES: [HeaderName; 5] = [
        header::TRANSFER_ENCODING,
        header::CONTENT_LENGTH,
        header::CONNECTION,
        header::EXPECT,
        header::DATE,
    ];

    /// The framing headers `headers` carries.
    pub(super) fn of(headers: &HeaderMap) -> Self {
        Self(crate::http::headers::present(headers, &Self::NAMES))
    }
    /// It carries `Transfer-Encoding`.
    pub(super) fn transfer_encoding(self) -> bool {
        self.0 & 1 != 0
    }
    /// It carries `Content-Length`.
    pub(super) fn content_length(self) -> bool {
        self.0 & 2 != 0
    }
    /// It carries `Connection`.
    pub(super) fn connection(self) -> bool {
        self.0 & 4 != 0
    }
    /// It carries `Expect`.
    pub(super) fn expect(self) -> bool {
        self.0 & 8 != 0
    }
    /// It carries `Date`.
    pub(super) fn date(self) -> bool {
        self.0 & 16 != 0
    }
    /// [`connection_kept`], without a lookup when there is no `Connection` header.
    pub(super) fn connection_kept(self, version: Version, headers: &HeaderMap) -> bool {
        if self.connection() {
            connection_kept(version, headers)
        } else {
            version != Version::HTTP_10
        }
    }
}

/// Where a head's header lines lie (names and values as offsets into it), kept while
/// the head is split off its buffer, so that the values share the head's bytes. Most
/// heads have a handful of lines: the first [`HeaderSpans::INLINE`] are kept inline
/// (a full array of [`MAX_HEADERS`] cost a 1.6 KB clear and copy per head).
pub(super) struct HeaderSpans {
    inline: [Span; HeaderSpans::INLINE],
    more: Vec<Span>,
    count: usize,
}

/// A header line's name and value, as offsets into its head.
type Span = ((u32, u32), (u32, u32));

impl HeaderSpans {
    /// Lines kept inline.
    const INLINE: usize = 24;

    /// The spans of `headers`, parsed from `head`.
    pub(super) fn of(head: &[u8], headers: &[httparse::Header<'_>]) -> Self {
        let mut spans =
            Self { inline: [((0, 0), (0, 0)); Self::INLINE], more: Vec::new(), count: 0 };
        for h in headers.iter().take(MAX_HEADERS) {
            let span = (offsets(head, h.name.as_bytes()), offsets(head, h.value));
            match spans.inline.get_mut(spans.count) {
                Some(slot) => *slot = span,
                None => spans.more.push(span),
            }
            spans.count += 1;
        }
        spans
    }

    fn iter(&self) -> impl Iterator<Item = &Span> {
        self.inline[..self.count.min(Self::INLINE)].iter().chain(&self.more)
    }

    /// The header map of `head` (the bytes the spans were taken from), with room for
    /// [`ADDED_HEADERS`] more; the part that is not a valid header, if one is not.
    pub(super) fn map(&self, head: &Bytes) -> Result<HeaderMap, &'static str> {
        let mut headers = HeaderMap::with_capacity(self.count + ADDED_HEADERS);
        for &((name_start, name_end), (start, end)) in self.iter() {
            let name = HeaderName::from_bytes(&head[name_start as usize..name_end as usize])
                .map_err(|_| "header name")?;
            let value = HeaderValue::from_maybe_shared(head.slice(start as usize..end as usize))
                .map_err(|_| "header value")?;
            headers.append(name, value);
        }
        Ok(headers)
    }
}

/// Where `part`, a slice of `head`, lies in it.
pub(super) fn offsets(head: &[u8], part: &[u8]) -> (u32, u32) {
    let start = part.as_ptr() as usize - head.as_ptr() as usize;
    (start as u32, (start + part.len()) as u32)
}

/// Decides how a request body is framed and sets the headers that say so, as hyper's
/// client does: a body that has ended has none; a `Transfer-Encoding` the client sent is
/// kept, ending in `chunked`; a valid `Content-Length` is trusted; a body of known size
/// gets its length; a body of unknown size is chunked, except on `GET`, `HEAD` and
/// `CONNECT`, which send none. The second value is a length for [`encode_head`] to
/// state (a body of known size without a `Content-Length`): written in the head, not
/// made a header value.
pub fn request_framing(
    method: &Method,
    headers: &mut HeaderMap,
    ended: bool,
    exact: Option<u64>,
) -> (Sending, Option<u64>) {
    let framers = Framers::of(headers);
    if ended {
        if framers.transfer_encoding() {
            headers.remove(header::TRANSFER_ENCODING);
        }
        return (Sending::Length(0), None);
    }
    let coding = framers.transfer_encoding().then(|| headers.get(header::TRANSFER_ENCODING));
    if let Some(coding) = coding.flatten() {
        if !last_coding_is_chunked(headers.get_all(header::TRANSFER_ENCODING).iter()) {
            let mut value = coding.as_bytes().to_vec();
            value.extend_from_slice(b", chunked");
            if let Ok(value) = HeaderValue::from_bytes(&value) {
                headers.insert(header::TRANSFER_ENCODING, value);
            }
        }
        headers.remove(header::CONTENT_LENGTH);
        return (Sending::Chunked { trailers: true }, None);
    }
    if framers.content_length() {
        if let Some(length) = content_length(headers) {
            return (Sending::Length(length), None);
        }
    }
    match exact {
        Some(length) => {
            if framers.content_length() {
                headers.remove(header::CONTENT_LENGTH);
            }
            (Sending::Length(length), Some(length))
        }
        None if matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) => {
            (Sending::Length(0), None)
        }
        None => {
            if framers.content_length() {
                headers.remove(header::CONTENT_LENGTH);
            }
            headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
            (Sending::Chunked { trailers: true }, None)
        }
    }
}

/// Appends `METHOD /path?query HTTP/1.1`, the headers (names as `http` spells them,
/// lower case), `content-length: length` when given, and the blank line to `out`.
pub fn encode_head(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    length: Option<u64>,
    out: &mut Vec<u8>,
) {
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    put_headers(headers.iter(), out);
    if let Some(length) = length {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends one `name: value` line per header (names as `http` spells them, lower case).
pub(super) fn put_headers<'a>(
    headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    out: &mut Vec<u8>,
) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// The line that opens a chunk of `len` bytes.
pub fn chunk_line(len: usize) -> Vec<u8> {
    format!("{len:x}\r\n").into_bytes()
}

/// The last chunk and the trailer section (`trailers` may be empty).
pub fn last_chunk(trailers: Option<&HeaderMap>) -> Vec<u8> {
    let mut out = b"0\r\n".to_vec();
    put_headers(trailers.into_iter().flatten(), &mut out);
    out.extend_from_slice(b"\r\n");
    out
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (`HEAD`, 1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the upstream closes the connection.
    Close,
}

/// A response head read off the connection.
#[derive(Debug)]
pub struct Head {
    /// Status, version and headers; the body is the caller's.
    pub response: Response<()>,
    /// How its body is delimited.
    pub framing: Framing,
    /// The connection may carry another request once this body has been read.
    pub keep_alive: bool,
}

/// Reads a response head from the front of `buf`, removing it (and any interim 1xx
/// responses before it); `None` when `buf` does not hold a whole head yet. `method` is
/// the request's: a `HEAD` response has no body whatever its headers say.
pub fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, WireError> {
    loop {
        // Uninitialized: httparse writes the slots it fills (zeroing all of them cost
        // more than parsing a small head).
        let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let status = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut slots,
        );
        let length = match status {
            Ok(httparse::Status::Complete(length)) if length > MAX_HEAD => {
                return Err(WireError::HeadTooLarge);
            }
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(WireError::HeadTooLarge);
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(WireError::Head("too many headers"));
            }
            Err(_) => return Err(WireError::Head("malformed status line or header")),
        };
        let code = parsed.code.unwrap_or_default();
        let status = StatusCode::from_u16(code).map_err(|_| WireError::Head("status code"))?;
        // Interim answers (100 Continue, 103 Early Hints) precede the real one.
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            buf.advance(length);
            continue;
        }
        let version = match parsed.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // A reason phrase of the upstream's own goes to the client as it came (hyper's
        // server writes the extension), as hyper's client kept it.
        let reason = parsed
            .reason
            .filter(|r| Some(*r) != status.canonical_reason())
            .and_then(|r| hyper::ext::ReasonPhrase::try_from(r.as_bytes()).ok());
        let spans = HeaderSpans::of(buf, parsed.headers);
        let head = buf.split_to(length).freeze();
        let headers = spans.map(&head).map_err(WireError::Head)?;
        let framers = Framers::of(&headers);
        let (framing, mut keep_alive) = framing(method, status, version, &headers, framers)?;
        keep_alive &= framers.connection_kept(version, &headers);
        let mut response = Response::new(());
        if let Some(reason) = reason {
            response.extensions_mut().insert(reason);
        }
        *response.status_mut() = status;
        *response.version_mut() = version;
        *response.headers_mut() = headers;
        return Ok(Some(Head { response, framing, keep_alive }));
    }
}

/// The body's delimitation (RFC 9112 §6.3), and whether the connection can stay open
/// after it as far as the framing goes.
fn framing(
    method: &Method,
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
    framers: Framers,
) -> Result<(Framing, bool), WireError> {
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok((Framing::Empty, false));
    }
    if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Empty, true));
    }
    if framers.transfer_encoding() {
        // With a Content-Length beside it, the message was meant to confuse: never reuse.
        let kept = !framers.content_length();
        let chunked = version == Version::HTTP_11
            && last_coding_is_chunked(headers.get_all(header::TRANSFER_ENCODING).iter());
        return Ok(if chunked { (Framing::Chunked, kept) } else { (Framing::Close, false) });
    }
    if framers.content_length() {
        let length = content_length(headers).ok_or(WireError::ContentLength)?;
        return Ok((Framing::Length(length), true));
    }
    Ok((Framing::Close, false))
}

/// The `Connection` header allows another request (HTTP/1.1 unless `close`; HTTP/1.0
/// only with `keep-alive`).
pub(super) fn connection_kept(version: Version, headers: &HeaderMap) -> bool {
    let has = |token: &str| {
        headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    match version {
        Version::HTTP_10 => has("keep-alive"),
        _ => !has("close"),
    }
}

pub(super) fn last_coding_is_chunked<'a>(
    values: impl DoubleEndedIterator<Item = &'a HeaderValue>,
) -> bool {
    values
        .last()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// The one length every `Content-Length` value (and comma-separated item) states.
pub(super) fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    // The usual case, one value of digits, read without splitting it.
    if let (Some(value), None) = (values.next(), values.next()) {
        let digits = value.as_bytes();
        if !digits.is_empty() && digits.len() <= 19 && digits.iter().all(u8::is_ascii_digit) {
            return Some(digits.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')));
        }
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for item in value.to_str().ok()?.split(',') {
            let item = item.trim();
            if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u64 = item.parse().ok()?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        }
    }
    length
}

/// What [`Decoder::decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The trailer section of a chunked body.
    Trailers(HeaderMap),
    /// The body has ended.
    End,
    /// More bytes are needed.
    More,
}

/// Takes a response body out of the bytes read from its connection.
#[derive(Debug)]
pub struct Decoder {
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    Close,
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    Done,
}

impl Decoder {
    /// A decoder for a body framed as `framing`.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::Close,
        };
        Self { state }
    }

    /// The body has ended (its last data may still be due to the caller).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes still to come, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// Takes what it can from the front of `buf`; bytes past the body's end stay there.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::End),
                State::Length(n) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let take = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
                    let left = n - take as u64;
                    self.state = if left == 0 { State::Done } else { State::Length(left) };
                    return Ok(Decoded::Data(buf.split_to(take).freeze()));
                }
                State::Close => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    return Ok(Decoded::Data(buf.split().freeze()));
                }
                State::ChunkSize => {
                    let Some(end) = memchr::memchr(b'\n', buf) else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(WireError::Chunk("chunk-size line too long"));
                        }
                        return Ok(Decoded::More);
                    };
                    if end > MAX_CHUNK_LINE {
                        return Err(WireError::Chunk("chunk-size line too long"));
                    }
                    let size = chunk_size(&buf[..end])?;
                    buf.advance(end + 1);
                    self.state = if size == 0 { State::Trailers } else { State::ChunkData(size) };
                }
                State::ChunkData(n) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let take = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
                    let left = n - take as u64;
                    self.state = if left == 0 { State::ChunkEnd } else { State::ChunkData(left) };
                    return Ok(Decoded::Data(buf.split_to(take).freeze()));
                }
                State::ChunkEnd => match line_end(buf) {
                    Some(Ok(n)) => {
                        buf.advance(n);
                        self.state = State::ChunkSize;
                    }
                    Some(Err(())) => return Err(WireError::Chunk("no line end after the data")),
                    None => return Ok(Decoded::More),
                },
                State::Trailers => {
                    // No trailers: the section is one empty line.
                    match line_end(buf) {
                        Some(Ok(n)) => {
                            buf.advance(n);
                            self.state = State::Done;
                            return Ok(Decoded::End);
                        }
                        None => return Ok(Decoded::More),
                        Some(Err(())) => {}
                    }
                    let too_large = WireError::Chunk("trailer section too large");
                    let Some(end) = section_end(buf) else {
                        if buf.len() > MAX_TRAILERS {
                            return Err(too_large);
                        }
                        return Ok(Decoded::More);
                    };
                    if end > MAX_TRAILERS {
                        return Err(too_large);
                    }
                    let trailers = trailer_map(&buf[..end])?;
                    buf.advance(end);
                    self.state = State::Done;
                    return Ok(Decoded::Trailers(trailers));
                }
            }
        }
    }

    /// The connection closed: the end of a close-delimited body, an error for any other
    /// body that has not ended.
    pub fn closed(&mut self) -> Result<Decoded, WireError> {
        match self.state {
            State::Close | State::Done => {
                self.state = State::Done;
                Ok(Decoded::End)
            }
            _ => Err(WireError::Incomplete),
        }
    }
}

/// `CRLF` or a bare `LF` at the front of `buf`: its length; `Err` for anything else;
/// `None` when `buf` is too short to tell.
fn line_end(buf: &[u8]) -> Option<Result<usize, ()>> {
    match buf {
        [] | [b'\r'] => None,
        [b'\r', b'\n', ..] => Some(Ok(2)),
        [b'\n', ..] => Some(Ok(1)),
        _ => Some(Err(())),
    }
}

/// The size of a chunk from its line (without the `LF`): hex digits, optional
/// whitespace, optional `;extensions`, optional `CR`.
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    let digits = digits.trim_ascii_end();
    if digits.is_empty() || digits.len() > 16 {
        return Err(WireError::Chunk("chunk size"));
    }
    let mut size: u64 = 0;
    for &b in digits {
        let digit = (b as char).to_digit(16).ok_or(WireError::Chunk("chunk size"))?;
        size = size << 4 | u64::from(digit);
    }
    Ok(size)
}

/// The length of the trailer section at the front of `buf`, through its blank line.
fn section_end(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = memchr::memchr(b'\n', &buf[from..]) {
        let next = from + at + 1;
        match line_end(&buf[next..]) {
            Some(Ok(n)) => return Some(next + n),
            None => return None,
            Some(Err(())) => from = next,
        }
    }
    None
}

fn trailer_map(section: &[u8]) -> Result<HeaderMap, WireError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let parsed = match httparse::parse_headers(section, &mut slots) {
        Ok(httparse::Status::Complete((_, parsed))) => parsed,
        _ => return Err(WireError::Chunk("malformed trailer")),
    };
    let mut trailers = HeaderMap::with_capacity(parsed.len());
    for h in parsed {
        let name =
            HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| WireError::Chunk("trailer"))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| WireError::Chunk("trailer"))?;
        trailers.append(name, value);
    }
    Ok(trailers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &str, method: &Method) -> Result<Option<Head>, WireError> {
        parse_head(&mut BytesMut::from(bytes), method)
    }

    /// Decodes `wire` fed in pieces of `step` bytes: the body, the trailers, the bytes
    /// left after its end, or the error.
    fn decode(framing: Framing, wire: &[u8], step: usize) -> Result<(Vec<u8>, usize), WireError> {
        let mut decoder = Decoder::new(framing);
        let (mut buf, mut body, mut fed) = (BytesMut::new(), Vec::new(), 0);
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(data) => body.extend_from_slice(&data),
                Decoded::Trailers(_) => {}
                Decoded::End => return Ok((body, buf.len() + wire.len() - fed)),
                Decoded::More if fed == wire.len() => {
                    decoder.closed()?;
                }
                Decoded::More => {
                    let next = (fed + step).min(wire.len());
                    buf.extend_from_slice(&wire[fed..next]);
                    fed = next;
                }
            }
        }
    }

    #[test]
    fn a_head_splits_off_and_its_values_are_the_bytes_read() {
        let mut buf = BytesMut::from(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 4\r\n\r\nbody",
        );
        let head = parse_head(&mut buf, &Method::POST).unwrap().unwrap();
        assert_eq!(head.response.status(), StatusCode::OK);
        assert_eq!(head.response.headers().get_all("x-a").iter().count(), 2);
        assert_eq!((head.framing, head.keep_alive), (Framing::Length(4), true));
        assert_eq!(&buf[..], b"body");
    }

    #[test]
    fn every_header_of_a_long_head_is_kept_in_order() {
        for lines in [0, 1, 23, 24, 25, 60, MAX_HEADERS - 1] {
            let mut text = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..lines {
                text.push_str(&format!("x-h{i}: v{i}\r\n"));
            }
            text.push_str("content-length: 0\r\n\r\n");
            let head = head(&text, &Method::GET).unwrap().unwrap();
            let names: Vec<_> = head.response.headers().keys().map(|n| n.to_string()).collect();
            let expected: Vec<_> =
                (0..lines).map(|i| format!("x-h{i}")).chain(["content-length".into()]).collect();
            assert_eq!(names, expected, "{lines} lines");
            let values: Vec<_> = (0..lines)
                .map(|i| head.response.headers()[format!("x-h{i}").as_str()].clone())
                .collect();
            assert!(values.iter().enumerate().all(|(i, v)| v == format!("v{i}").as_str()));
        }
    }

    #[test]
    fn a_partial_head_waits_and_an_endless_one_fails() {
        assert!(head("HTTP/1.1 200 OK\r\ncontent-le", &Method::GET).unwrap().is_none());
        let endless = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD + 1));
        assert_eq!(head(&endless, &Method::GET).unwrap_err(), WireError::HeadTooLarge);
        assert!(head("HTTP/1.1 2000 OK\r\n\r\n", &Method::GET).is_err());
        assert!(head("SMTP ready\r\n\r\n", &Method::GET).is_err());
    }

    #[test]
    fn a_reason_phrase_of_the_upstreams_own_is_kept() {
        let own = head("HTTP/1.1 429 Slow Down\r\ncontent-length: 0\r\n\r\n", &Method::GET);
        let own = own.unwrap().unwrap().response;
        let reason = own.extensions().get::<hyper::ext::ReasonPhrase>().unwrap();
        assert_eq!(reason.as_bytes(), b"Slow Down");
        let usual = head("HTTP/1.1 429 Too Many Requests\r\n\r\n", &Method::GET);
        assert!(usual.unwrap().unwrap().response.extensions().is_empty());
    }

    #[test]
    fn interim_answers_are_skipped() {
        let wire = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n";
        let head = head(wire, &Method::POST).unwrap().unwrap();
        assert_eq!(head.response.status(), StatusCode::CREATED);
        assert!(head.response.headers().get("link").is_none());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let framing = |wire: &str, method: &Method| {
            let h = head(wire, method).unwrap().unwrap();
            (h.framing, h.keep_alive)
        };
        let post = &Method::POST;
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", &Method::HEAD),
            (Framing::Empty, true)
        );
        assert_eq!(framing("HTTP/1.1 204 No Content\r\n\r\n", post), (Framing::Empty, true));
        assert_eq!(framing("HTTP/1.1 304 Not Modified\r\n\r\n", post), (Framing::Empty, true));
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n", post),
            (Framing::Chunked, true)
        );
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
                post
            ),
            (Framing::Chunked, false)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", post),
            (Framing::Close, false)
        );
        assert_eq!(framing("HTTP/1.1 200 OK\r\n\r\n", post), (Framing::Close, false));
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\nconnection: close\r\n\r\n", post),
            (Framing::Length(7), false)
        );
        assert_eq!(
            framing("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n", post),
            (Framing::Length(1), false)
        );
        assert_eq!(
            framing("HTTP/1.0 200 OK\r\ncontent-length: 1\r\nconnection: Keep-Alive\r\n\r\n", post),
            (Framing::Length(1), true)
        );
        for bad in ["1, 2", "-1", "", "0x10", "1 2"] {
            let wire = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert!(head(&wire, post).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_chunked_body_decodes_in_pieces_of_any_size() {
        let wire = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nx-checksum: 1\r\n\r\nNEXT";
        for step in 1..wire.len() {
            let (body, left) = decode(Framing::Chunked, wire, step).unwrap();
            assert_eq!(body, b"Wikipedia in\r\n\r\nchunks.", "step {step}");
            assert_eq!(left, 4, "step {step}");
        }
        let lf_only = b"3\nabc\n0\n\n";
        assert_eq!(decode(Framing::Chunked, lf_only, 2).unwrap(), (b"abc".to_vec(), 0));
    }

    #[test]
    fn malformed_or_cut_chunks_are_errors() {
        for bad in [&b"g\r\n"[..], b"3\r\nabcX\r\n", b"11111111111111111\r\n", b"\r\n"] {
            assert!(
                decode(Framing::Chunked, bad, 3).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(decode(Framing::Chunked, b"5\r\nab", 8).unwrap_err(), WireError::Incomplete);
        assert_eq!(decode(Framing::Length(5), b"abc", 8).unwrap_err(), WireError::Incomplete);
        assert_eq!(decode(Framing::Close, b"abc", 2).unwrap(), (b"abc".to_vec(), 0));
        assert_eq!(decode(Framing::Length(2), b"abc", 8).unwrap(), (b"ab".to_vec(), 1));
    }

    #[test]
    fn request_framing_matches_hypers_client() {
        let frame = |method: Method, headers: &[(&str, &str)], ended: bool, exact: Option<u64>| {
            let mut map = HeaderMap::new();
            for (n, v) in headers {
                map.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap());
            }
            let (framing, stated) = request_framing(&method, &mut map, ended, exact);
            let get = |n: &str| map.get(n).map(|v| v.to_str().unwrap().to_owned());
            let length = get("content-length").or(stated.map(|n| n.to_string()));
            (framing, length, get("transfer-encoding"))
        };
        use Sending::Length;
        let chunked = Sending::Chunked { trailers: true };
        assert_eq!(frame(Method::POST, &[], false, Some(3)), (Length(3), Some("3".into()), None));
        assert_eq!(frame(Method::POST, &[], false, None), (chunked, None, Some("chunked".into())));
        assert_eq!(frame(Method::GET, &[], false, None), (Length(0), None, None));
        assert_eq!(frame(Method::POST, &[], true, Some(0)), (Length(0), None, None));
        assert_eq!(
            frame(Method::POST, &[("content-length", "9")], false, None),
            (Length(9), Some("9".into()), None)
        );
        // An invalid length is replaced by the body's own.
        assert_eq!(
            frame(Method::POST, &[("content-length", "x")], false, Some(4)),
            (Length(4), Some("4".into()), None)
        );
        assert_eq!(
            frame(
                Method::POST,
                &[("transfer-encoding", "gzip"), ("content-length", "9")],
                false,
                None
            ),
            (chunked, None, Some("gzip, chunked".into()))
        );
    }

    #[test]
    fn a_head_encodes_as_written() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("api.example"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(2));
        let mut out = Vec::new();
        encode_head(&Method::POST, &Uri::from_static("/v1/x?a=1"), &headers, None, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/x?a=1 HTTP/1.1\r\nhost: api.example\r\ncontent-length: 2\r\n\r\n"
        );
        headers.remove(header::CONTENT_LENGTH);
        let mut out = Vec::new();
        encode_head(&Method::PUT, &Uri::from_static("/"), &headers, Some(70), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "PUT / HTTP/1.1\r\nhost: api.example\r\ncontent-length: 70\r\n\r\n"
        );
        assert_eq!(chunk_line(255), b"ff\r\n");
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("1"));
        assert_eq!(last_chunk(Some(&trailers)), b"0\r\nx-sum: 1\r\n\r\n");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// Any body, sent with a length or in chunks of any sizes (with or without
        /// extensions and trailers), decodes to itself however the reads cut it, and
        /// what follows it stays in the buffer.
        #[test]
        fn any_body_decodes_to_itself_however_the_reads_cut_it(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            cuts in proptest::collection::vec(1usize..64, 1..8),
            step in 1usize..97,
            chunked in proptest::bool::ANY,
            extensions in proptest::bool::ANY,
            trailer in proptest::bool::ANY,
        ) {
            let mut wire = Vec::new();
            let framing = if chunked {
                let mut at = 0;
                for &cut in cuts.iter().cycle() {
                    if at >= body.len() {
                        break;
                    }
                    let end = (at + cut).min(body.len());
                    wire.extend_from_slice(format!("{:X}", end - at).as_bytes());
                    if extensions {
                        wire.extend_from_slice(b" ;name=\"v\"");
                    }
                    wire.extend_from_slice(b"\r\n");
                    wire.extend_from_slice(&body[at..end]);
                    wire.extend_from_slice(b"\r\n");
                    at = end;
                }
                wire.extend_from_slice(if trailer { b"0\r\nx-sum: 7\r\n\r\n" } else { b"0\r\n\r\n" });
                Framing::Chunked
            } else {
                wire.extend_from_slice(&body);
                Framing::Length(body.len() as u64)
            };
            wire.extend_from_slice(b"NEXT");
            let (decoded, left) = decode(framing, &wire, step).unwrap();
            proptest::prop_assert_eq!(decoded, body);
            proptest::prop_assert_eq!(left, 4);
        }
    }
}
