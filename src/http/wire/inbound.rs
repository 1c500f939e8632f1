//! HTTP/1.1 messages from and to clients as bytes: the request head a client sends and
//! how its body is framed, the response head foldgate writes and how that body goes
//! out. No I/O here (that is `super::server`): the unit tests and the fuzz target feed
//! these functions bytes.
//!
//! The rules are hyper's server's, which served these connections before: a request
//! body is framed by `Transfer-Encoding: chunked` (which wins over `Content-Length`) or
//! by one valid `Content-Length`, anything else is refused; a response keeps the
//! framing its headers state, gets a `Content-Length` when its size is known, and is
//! chunked (or, to an HTTP/1.0 client, delimited by the close) otherwise.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, StatusCode, Uri, Version};

use super::codec::{self, Framers, Framing, HeaderSpans, MAX_HEAD, MAX_HEADERS, Sending};
use crate::http::tags::Tags;

/// Why a request head was refused; each answers with its own status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// The request line or a header is malformed, or the body's framing is unclear.
    #[error("malformed HTTP/1.1 request: {0}")]
    Malformed(&'static str),
    /// The head did not end within [`MAX_HEAD`] bytes (or has too many headers).
    #[error("request head larger than {MAX_HEAD} bytes or {MAX_HEADERS} headers")]
    TooLarge,
    /// Not HTTP/1.0 or HTTP/1.1.
    #[error("HTTP version not supported")]
    Version,
}

impl HeadError {
    /// The status a client is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::Version => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
        }
    }
}

/// A request head read off a client connection.
#[derive(Debug)]
pub struct RequestHead {
    /// Method, target, version and headers; the body is the caller's.
    pub request: Request<()>,
    /// How its body is delimited: [`Framing::Length`] or [`Framing::Chunked`].
    pub framing: Framing,
    /// The connection may carry another request after this one, as far as the client
    /// says (HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with `keep-alive`).
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before it sends the body.
    pub expects_continue: bool,
}

/// Reads a request head from the front of `buf`, removing it; `None` when `buf` does
/// not hold a whole head yet. Empty lines before the request line are skipped, as
/// RFC 9112 §2.2 allows.
pub fn parse_request_head(buf: &mut BytesMut) -> Result<Option<RequestHead>, HeadError> {
    // Uninitialized: httparse writes the slots it fills.
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let length = match parsed.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(length)) if length > MAX_HEAD => {
            return Err(HeadError::TooLarge);
        }
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(httparse::Error::Version) => return Err(HeadError::Version),
        Err(_) => return Err(HeadError::Malformed("request line or header")),
    };
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let method = parsed.method.unwrap_or_default();
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| HeadError::Malformed("method"))?;
    // Offsets into the head, so that the target and the header values share its bytes.
    let target = codec::offsets(buf, parsed.path.unwrap_or_default().as_bytes());
    let spans = HeaderSpans::of(buf, parsed.headers);
    let head = buf.split_to(length).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target.0 as usize..target.1 as usize))
        .map_err(|_| HeadError::Malformed("target"))?;
    // With room for what foldgate adds before forwarding (the request id).
    let mut headers = spans.map(&head).map_err(HeadError::Malformed)?;
    let framers = Framers::of(&headers);
    let framing = request_framing(version, &mut headers, framers)?;
    let keep_alive = framers.connection_kept(version, &headers);
    let expects_continue = version == Version::HTTP_11
        && framing != Framing::Length(0)
        && framers.expect()
        && headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    Ok(Some(RequestHead { request, framing, keep_alive, expects_continue }))
}

/// The request body's framing (RFC 9112 §6.3). A `Content-Length` beside
/// `Transfer-Encoding` is removed: the chunks decide, and nothing downstream may read
/// the length as the body's.
fn request_framing(
    version: Version,
    headers: &mut HeaderMap,
    framers: Framers,
) -> Result<Framing, HeadError> {
    if framers.transfer_encoding() {
        if version == Version::HTTP_10 {
            return Err(HeadError::Malformed("transfer-encoding in an HTTP/1.0 request"));
        }
        if !codec::last_coding_is_chunked(headers.get_all(header::TRANSFER_ENCODING).iter()) {
            return Err(HeadError::Malformed("transfer-encoding without chunked last"));
        }
        headers.remove(header::CONTENT_LENGTH);
        return Ok(Framing::Chunked);
    }
    if !framers.content_length() {
        return Ok(Framing::Length(0));
    }
    codec::content_length(headers)
        .map(Framing::Length)
        .ok_or(HeadError::Malformed("content-length"))
}

/// What the request a response answers says about it.
#[derive(Debug, Clone, Copy)]
pub struct Answering {
    /// The request's version.
    pub version: Version,
    /// It was a `HEAD` request.
    pub head: bool,
    /// It sent `TE: trailers`.
    pub trailers: bool,
    /// The connection stays open after this response, unless the response says
    /// otherwise.
    pub keep_alive: bool,
}

impl Answering {
    /// What `request` says about its response; `keep_alive` is whether the connection
    /// may stay open (the client's wish and the server's).
    pub fn of<B>(request: &Request<B>, keep_alive: bool) -> Self {
        let trailers = request.headers().get_all(header::TE).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("trailers")))
        });
        Self {
            version: request.version(),
            head: request.method() == Method::HEAD,
            trailers,
            keep_alive,
        }
    }
}

/// A response head, ready to write.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status line, the headers and the blank line.
    pub bytes: Vec<u8>,
    /// How the body goes out (`Length(0)`: nothing follows the head).
    pub sending: Sending,
    /// The connection stays open after the body.
    pub keep_alive: bool,
}

/// Writes the head of a response with `status`, `reason` (the upstream's own phrase,
/// when it had one) and `headers` to a client making the request `answering`, whose
/// body has exactly `exact` bytes when that is known (`ended`: it has none left). The
/// headers go out as they are, plus what the framing needs (`content-length`,
/// `transfer-encoding`), `date` when they have none, and `connection: close` when the
/// connection ends after this response.
pub fn response_head(
    status: StatusCode,
    reason: Option<&[u8]>,
    headers: &mut HeaderMap,
    tags: Option<&Tags>,
    answering: Answering,
    ended: bool,
    exact: Option<u64>,
) -> ResponseHead {
    let mut keep_alive = answering.keep_alive;
    // Removing Transfer-Encoding or Content-Length below leaves the other names as found.
    let framers = Framers::of(headers);
    if !framers.connection_kept(Version::HTTP_11, headers) {
        keep_alive = false;
    }
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let old_client = answering.version == Version::HTTP_10;
    let mut extra = Extra::default();
    let sending = if bodiless {
        headers.remove(header::TRANSFER_ENCODING);
        if status != StatusCode::NOT_MODIFIED {
            headers.remove(header::CONTENT_LENGTH);
        }
        Sending::Length(0)
    } else if framers.transfer_encoding() {
        // The response's own coding: chunked stays last; an HTTP/1.0 client cannot
        // read chunks, so it gets the bytes until the close instead.
        headers.remove(header::CONTENT_LENGTH);
        if old_client {
            headers.remove(header::TRANSFER_ENCODING);
            keep_alive = false;
            Sending::UntilClose
        } else {
            if !codec::last_coding_is_chunked(headers.get_all(header::TRANSFER_ENCODING).iter()) {
                let mut value = headers
                    .get_all(header::TRANSFER_ENCODING)
                    .iter()
                    .map(HeaderValue::as_bytes)
                    .collect::<Vec<_>>()
                    .join(&b", "[..]);
                value.extend_from_slice(b", chunked");
                if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
                    headers.insert(header::TRANSFER_ENCODING, value);
                }
            }
            Sending::Chunked { trailers: answering.trailers }
        }
    } else if let Some(length) =
        framers.content_length().then(|| declared_length(headers)).flatten()
    {
        Sending::Length(length)
    } else if let Some(length) = exact.or(ended.then_some(0)) {
        if !(answering.head && length == 0) {
            extra.content_length = Some(length);
        }
        Sending::Length(length)
    } else if old_client {
        keep_alive = false;
        Sending::UntilClose
    } else {
        extra.chunked = true;
        Sending::Chunked { trailers: answering.trailers }
    };
    let sending = if answering.head { Sending::Length(0) } else { sending };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        keep_alive = false;
    }
    extra.close = !keep_alive && status != StatusCode::SWITCHING_PROTOCOLS && !framers.connection();
    extra.keep_alive = keep_alive && old_client && !framers.connection();
    extra.date = !framers.date();
    let bytes = encode(status, reason, headers, tags, &extra);
    ResponseHead { bytes, sending, keep_alive }
}

/// The `Content-Length` the headers state, when they state one valid length; an invalid
/// one is removed (the body's own size decides then).
fn declared_length(headers: &mut HeaderMap) -> Option<u64> {
    let length = codec::content_length(headers);
    if length.is_none() {
        headers.remove(header::CONTENT_LENGTH);
    }
    length
}

/// Header lines written beside the response's own.
#[derive(Debug, Default)]
struct Extra {
    content_length: Option<u64>,
    chunked: bool,
    close: bool,
    keep_alive: bool,
    date: bool,
}

fn encode(
    status: StatusCode,
    reason: Option<&[u8]>,
    headers: &HeaderMap,
    tags: Option<&Tags>,
    extra: &Extra,
) -> Vec<u8> {
    // foldgate's tags are 7 lines of about 40 bytes on a decided request.
    let room = if tags.is_some() { 320 } else { 0 };
    let mut out = Vec::with_capacity(160 + headers.len() * 48 + room);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    let reason = reason.unwrap_or_else(|| status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
    match tags {
        Some(tags) => {
            codec::put_headers(headers.iter().filter(|(name, _)| !tags.replaces(name)), &mut out);
            tags.write(&mut out);
        }
        None => codec::put_headers(headers.iter(), &mut out),
    }
    if let Some(length) = extra.content_length {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if extra.chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if extra.close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if extra.keep_alive {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if extra.date {
        out.extend_from_slice(b"date: ");
        with_date(|date| out.extend_from_slice(date));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The HTTP date of the current second, formatted once per second per thread.
fn with_date(f: impl FnOnce(&[u8])) {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != second {
            *at = second;
            *text = httpdate::fmt_http_date(now);
        }
        f(text.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &str) -> Result<Option<RequestHead>, HeadError> {
        parse_request_head(&mut BytesMut::from(bytes))
    }

    fn answering(version: Version, head: bool) -> Answering {
        Answering { version, head, trailers: false, keep_alive: true }
    }

    /// The head of a `200` of unknown size whose body has not ended.
    fn ok_head(headers: &mut HeaderMap, answering: Answering) -> ResponseHead {
        response_head(StatusCode::OK, None, headers, None, answering, false, None)
    }

    fn text(head: &ResponseHead) -> String {
        String::from_utf8(head.bytes.clone()).unwrap()
    }

    #[test]
    fn a_request_head_splits_off_and_shares_its_bytes() {
        let mut buf = BytesMut::from(
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nX-A: 1\r\nx-a: 2\r\n\r\nbodyGET",
        );
        let head = parse_request_head(&mut buf).unwrap().unwrap();
        assert_eq!(head.request.method(), Method::POST);
        assert_eq!(head.request.uri().path(), "/v1/chat/completions");
        assert_eq!(head.request.uri().query(), Some("x=1"));
        assert_eq!(head.request.headers().get_all("x-a").iter().count(), 2);
        assert_eq!((head.framing, head.keep_alive), (Framing::Length(4), true));
        assert!(!head.expects_continue);
        assert_eq!(&buf[..], b"bodyGET");
    }

    #[test]
    fn partial_endless_and_invalid_heads() {
        assert!(parse("GET / HTTP/1.1\r\nHost: a").unwrap().is_none());
        let endless = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD + 1));
        assert_eq!(parse(&endless).unwrap_err(), HeadError::TooLarge);
        assert_eq!(parse("GET / HTTP/2.0\r\n\r\n").unwrap_err(), HeadError::Version);
        assert!(matches!(parse("GET\r\n\r\n"), Err(HeadError::Malformed(_))));
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nbad header\r\n\r\n"),
            Err(HeadError::Malformed(_))
        ));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert_eq!(
            parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            HeadError::TooLarge
        );
    }

    #[test]
    fn request_bodies_are_framed_as_rfc_9112_says() {
        let framing = |head: &str| parse(head).map(|h| h.unwrap().framing);
        assert_eq!(framing("GET / HTTP/1.1\r\n\r\n"), Ok(Framing::Length(0)));
        assert_eq!(
            framing("POST / HTTP/1.1\r\ncontent-length: 12\r\n\r\n"),
            Ok(Framing::Length(12))
        );
        assert_eq!(
            framing("POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n"),
            Ok(Framing::Length(3))
        );
        assert!(
            framing("POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n").is_err()
        );
        assert!(framing("POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n").is_err());
        assert!(framing("POST / HTTP/1.1\r\ncontent-length: 1 2\r\n\r\n").is_err());
        assert_eq!(
            framing("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert!(framing("POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n").is_err());
        assert!(framing("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        // Chunks win over a length beside them, and the length goes.
        let head =
            parse("POST / HTTP/1.1\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!(head.framing, Framing::Chunked);
        assert!(!head.request.headers().contains_key(header::CONTENT_LENGTH));
    }

    #[test]
    fn keep_alive_and_continue_follow_the_client() {
        let head = |h: &str| parse(h).unwrap().unwrap();
        assert!(!head("GET / HTTP/1.1\r\nconnection: close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").keep_alive);
        let expect = "POST / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 3\r\n\r\n";
        assert!(head(expect).expects_continue);
        assert!(!head("GET / HTTP/1.1\r\nexpect: 100-continue\r\n\r\n").expects_continue);
    }

    #[test]
    fn a_response_of_known_size_gets_its_length_and_a_date() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let head = response_head(
            StatusCode::OK,
            None,
            &mut headers,
            None,
            answering(Version::HTTP_11, false),
            false,
            Some(42),
        );
        let written = text(&head);
        assert!(written.starts_with("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"));
        assert!(written.contains("content-length: 42\r\n"));
        assert!(written.contains("\r\ndate: "));
        assert!(written.ends_with("\r\n\r\n"));
        assert_eq!((head.sending, head.keep_alive), (Sending::Length(42), true));
    }

    #[test]
    fn an_unknown_size_is_chunked_or_until_the_close() {
        let mut headers = HeaderMap::new();
        let head = ok_head(&mut headers, answering(Version::HTTP_11, false));
        assert!(text(&head).contains("transfer-encoding: chunked\r\n"));
        assert_eq!(head.sending, Sending::Chunked { trailers: false });
        let old = answering(Version::HTTP_10, false);
        let head = ok_head(&mut headers, old);
        assert_eq!((head.sending, head.keep_alive), (Sending::UntilClose, false));
        assert!(text(&head).contains("connection: close\r\n"));
    }

    #[test]
    fn the_responses_own_framing_and_reason_are_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        headers.insert(header::DATE, HeaderValue::from_static("Sat, 28 Nov 2026 00:00:00 GMT"));
        let head = response_head(
            StatusCode::OK,
            Some(b"Fine"),
            &mut headers,
            None,
            answering(Version::HTTP_11, false),
            false,
            None,
        );
        let written = text(&head);
        assert!(written.starts_with("HTTP/1.1 200 Fine\r\n"));
        assert_eq!(written.matches("content-length").count(), 1);
        assert_eq!(written.matches("date").count(), 1);
        assert_eq!(head.sending, Sending::Length(7));
        let mut headers = HeaderMap::new();
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        let head = ok_head(&mut headers, answering(Version::HTTP_11, false));
        assert!(text(&head).contains("transfer-encoding: gzip, chunked\r\n"));
    }

    #[test]
    fn bodiless_answers_send_nothing_after_the_head() {
        let mut headers = HeaderMap::new();
        let head = response_head(
            StatusCode::NO_CONTENT,
            None,
            &mut headers,
            None,
            answering(Version::HTTP_11, false),
            true,
            Some(0),
        );
        assert_eq!(head.sending, Sending::Length(0));
        assert!(!text(&head).contains("content-length"));
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        let head = ok_head(&mut headers, answering(Version::HTTP_11, true));
        assert_eq!(head.sending, Sending::Length(0));
        assert!(text(&head).contains("content-length: 10\r\n"));
    }

    #[test]
    fn a_closing_connection_says_so_once() {
        let mut headers = HeaderMap::new();
        let close = Answering { keep_alive: false, ..answering(Version::HTTP_11, false) };
        let head = response_head(StatusCode::OK, None, &mut headers, None, close, true, Some(0));
        assert_eq!(text(&head).matches("connection: close").count(), 1);
        assert!(!head.keep_alive);
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        let open = answering(Version::HTTP_11, false);
        let head = response_head(StatusCode::OK, None, &mut headers, None, open, true, Some(0));
        assert_eq!(text(&head).matches("connection: close").count(), 1);
        assert!(!head.keep_alive);
    }
}
