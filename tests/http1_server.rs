//! The client side of foldgate's HTTP/1.1 server, over raw TCP: what clients rely on
//! besides the common case the other suites exercise (pipelined requests, `100
//! Continue`, HTTP/1.0 clients, chunked uploads, refused heads, streamed answers, and
//! the connection kept or closed as each side asks).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One answer read off the socket.
#[derive(Debug)]
struct Answer {
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn status(&self) -> u16 {
        self.head[9..12].parse().unwrap()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// A connection that reads answers one after another.
struct Conn {
    stream: TcpStream,
    read: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Self {
        Self { stream: TcpStream::connect(addr).await.unwrap(), read: Vec::new() }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads more; false at the end of the stream.
    async fn fill(&mut self) -> bool {
        let mut buf = [0u8; 16 * 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap_or(0);
        self.read.extend_from_slice(&buf[..n]);
        n > 0
    }

    async fn head(&mut self) -> String {
        loop {
            if let Some(end) = self.read.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(self.read.drain(..end + 4).collect()).unwrap();
                return head;
            }
            assert!(self.fill().await, "closed before a head: {:?}", self.read);
        }
    }

    /// The next answer; its body delimited by its length, its chunks or the close.
    async fn answer(&mut self) -> Answer {
        let head = self.head().await;
        let answer = Answer { head, body: Vec::new() };
        let length = answer.header("content-length").map(|v| v.parse::<usize>().unwrap());
        let chunked = answer.header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let mut body = Vec::new();
        if let Some(length) = length {
            while self.read.len() < length {
                assert!(self.fill().await, "closed within the body");
            }
            body = self.read.drain(..length).collect();
        } else if chunked {
            loop {
                let line_end = loop {
                    if let Some(at) = self.read.windows(2).position(|w| w == b"\r\n") {
                        break at;
                    }
                    assert!(self.fill().await);
                };
                let size = usize::from_str_radix(
                    std::str::from_utf8(&self.read[..line_end]).unwrap().trim(),
                    16,
                )
                .unwrap();
                while self.read.len() < line_end + 2 + size + 2 {
                    assert!(self.fill().await);
                }
                body.extend_from_slice(&self.read[line_end + 2..line_end + 2 + size]);
                self.read.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    break;
                }
            }
        } else {
            while self.fill().await {}
            body = std::mem::take(&mut self.read);
        }
        Answer { body, ..answer }
    }

    /// The server closed the connection (nothing more to read).
    async fn closed(&mut self) -> bool {
        self.read.is_empty() && !self.fill().await
    }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: foldgate\r\n\r\n").into_bytes()
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: foldgate\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let mut conn = Conn::open(proxy.addr).await;
    let mut both = post("/v1/embeddings", r#"{"n":1}"#);
    both.extend(post("/v1/embeddings", r#"{"n":2}"#));
    both.extend(get("/healthz"));
    conn.send(&both).await;
    let first = conn.answer().await;
    let second = conn.answer().await;
    let third = conn.answer().await;
    assert_eq!((first.status(), first.body.as_slice()), (200, &br#"{"n":1}"#[..]));
    assert_eq!((second.status(), second.body.as_slice()), (200, &br#"{"n":2}"#[..]));
    assert_eq!(third.status(), 200);
    assert_eq!(
        mock.connections.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one upstream connection"
    );
    // Still open: one more request on the same connection.
    conn.send(&get("/healthz")).await;
    assert_eq!(conn.answer().await.status(), 200);
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let mut conn = Conn::open(proxy.addr).await;
    let body = r#"{"input":"x"}"#;
    conn.send(
        format!(
            "POST /v1/embeddings HTTP/1.1\r\nhost: f\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    let interim = conn.head().await;
    assert!(interim.starts_with("HTTP/1.1 100 Continue\r\n"), "{interim}");
    conn.send(body.as_bytes()).await;
    let answer = conn.answer().await;
    assert_eq!((answer.status(), answer.body.as_slice()), (200, body.as_bytes()));
}

#[tokio::test]
async fn a_chunked_upload_reaches_the_upstream_whole() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(
        b"POST /v1/embeddings HTTP/1.1\r\nhost: f\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n\
          5;ext=1\r\n{\"a\":\r\n3\r\n42}\r\n0\r\nx-trailer: t\r\n\r\n",
    )
    .await;
    let answer = conn.answer().await;
    assert_eq!((answer.status(), answer.body.as_slice()), (200, &br#"{"a":42}"#[..]));
    let forwarded = &mock.recorded()[0];
    assert_eq!(&forwarded.body[..], br#"{"a":42}"#);
    // The chunks decided the body; the length the client sent beside them was dropped.
    assert_ne!(forwarded.headers.get("content-length").map(|v| v.as_bytes()), Some(&b"3"[..]));
    conn.send(&get("/healthz")).await;
    assert_eq!(conn.answer().await.status(), 200, "the connection carries on");
}

#[tokio::test]
async fn an_http_1_0_client_gets_its_answer_and_the_close() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(b"POST /v1/embeddings HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}").await;
    let answer = conn.answer().await;
    assert_eq!((answer.status(), answer.body.as_slice()), (200, &b"{}"[..]));
    assert!(answer.header("transfer-encoding").is_none(), "no chunks for HTTP/1.0");
    assert!(conn.closed().await, "HTTP/1.0 without keep-alive closes");

    let mut conn = Conn::open(proxy.addr).await;
    conn.send(b"GET /healthz HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").await;
    let answer = conn.answer().await;
    assert_eq!(answer.header("connection"), Some("keep-alive"));
    conn.send(b"GET /healthz HTTP/1.0\r\n\r\n").await;
    assert_eq!(conn.answer().await.status(), 200);
    assert!(conn.closed().await);
}

#[tokio::test]
async fn a_streamed_answer_goes_out_as_it_comes_chunked_or_until_the_close() {
    let mock = MockUpstream::start(Arc::new(|_| {
        Box::pin(async {
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                for i in 0..3 {
                    let event = Bytes::from(format!("data: {i}\n\n"));
                    if tx.send(Ok(Frame::data(event))).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            let mut response = http::Response::new(body);
            response.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            response
        })
    }))
    .await;
    let proxy = Proxy::to(&mock.url()).await;
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&post("/v1/embeddings", "{}")).await;
    let answer = conn.answer().await;
    assert_eq!(answer.header("transfer-encoding"), Some("chunked"));
    assert_eq!(answer.body, b"data: 0\n\ndata: 1\n\ndata: 2\n\n");

    let mut conn = Conn::open(proxy.addr).await;
    conn.send(b"POST /v1/embeddings HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}").await;
    let answer = conn.answer().await;
    assert!(
        answer.header("content-length").is_none() && answer.header("transfer-encoding").is_none()
    );
    assert_eq!(answer.body, b"data: 0\n\ndata: 1\n\ndata: 2\n\n", "delimited by the close");
}

#[tokio::test]
async fn malformed_heads_get_a_clear_error_and_the_close() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let cases: [(&[u8], u16); 5] = [
        (b"GET / HTTP/1.1\r\nbad header line\r\n\r\n", 400),
        (b"POST /v1/embeddings HTTP/1.1\r\ncontent-length: 1, 2\r\n\r\n", 400),
        (b"POST /v1/embeddings HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n", 400),
        (b"GET / HTTP/3.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nx-long: ", 431),
    ];
    for (request, status) in cases {
        let mut conn = Conn::open(proxy.addr).await;
        conn.send(request).await;
        if status == 431 {
            // A head that never ends: past the largest head foldgate reads.
            let filler = vec![b'a'; 64 * 1024];
            for _ in 0..8 {
                if conn.stream.write_all(&filler).await.is_err() {
                    break;
                }
            }
        }
        let answer = conn.answer().await;
        assert_eq!(answer.status(), status, "{}", String::from_utf8_lossy(request));
        let error: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(error["error"]["code"], "malformed_request", "{error}");
        assert_eq!(answer.header("connection"), Some("close"));
    }
    assert!(mock.recorded().is_empty(), "nothing malformed reached the upstream");
}

#[tokio::test]
async fn a_client_asking_to_close_gets_the_close_after_its_answer() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(b"GET /healthz HTTP/1.1\r\nconnection: close\r\n\r\n").await;
    let answer = conn.answer().await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(answer.header("date").is_some(), "a date, as every HTTP/1.1 origin sends");
    assert!(conn.closed().await);
}

#[tokio::test]
async fn a_head_request_gets_the_head_only() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(b"HEAD /v1/models HTTP/1.1\r\nhost: f\r\n\r\n").await;
    let head = conn.head().await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    conn.send(&get("/healthz")).await;
    let next = conn.answer().await;
    assert_eq!(next.status(), 200, "no body bytes were left between the two answers");
}
