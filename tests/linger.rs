//! Lingering close: a client still uploading when foldgate answers early (a 413, a 404,
//! an upstream that answered before reading) can read that answer. Raw TCP clients that,
//! like most HTTP clients, send the whole body before they read anything.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use foldgate::config::ByteSize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MIB: usize = 1024 * 1024;
/// 33 MiB: one MiB over the default `server.max_body_size`.
const OVER_DEFAULT_LIMIT: usize = 33 * MIB;

/// An answer read off the socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The server closed the connection after the answer (EOF), within the read timeout.
    closed: bool,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn error_code(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body))
        });
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        v["error"]["code"].as_str().unwrap_or_default().to_owned()
    }
}

/// How the request body is framed.
#[derive(Clone, Copy)]
enum Framing {
    Length,
    Chunked,
}

/// Sends `POST path` with a body of `total` bytes in 1 MiB pieces, pausing between
/// them, then reads the answer. Fails if a write fails (the server reset the connection).
async fn upload_then_read(
    addr: SocketAddr,
    path: &str,
    framing: Framing,
    total: usize,
) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(addr).await?;
    let framing_header = match framing {
        Framing::Length => format!("content-length: {total}"),
        Framing::Chunked => "transfer-encoding: chunked".to_owned(),
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: foldgate\r\ncontent-type: application/json\r\n\
         authorization: Bearer sk-test\r\n{framing_header}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let piece = vec![b'x'; MIB];
    let mut sent = 0;
    while sent < total {
        let n = piece.len().min(total - sent);
        match framing {
            Framing::Length => stream.write_all(&piece[..n]).await?,
            Framing::Chunked => {
                stream.write_all(format!("{n:x}\r\n").as_bytes()).await?;
                stream.write_all(&piece[..n]).await?;
                stream.write_all(b"\r\n").await?;
            }
        }
        sent += n;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    if let Framing::Chunked = framing {
        stream.write_all(b"0\r\n\r\n").await?;
    }
    read_answer(&mut stream, Duration::from_secs(3)).await
}

/// Reads one answer (a `content-length` body), then waits up to `wait` for EOF.
async fn read_answer(stream: &mut TcpStream, wait: Duration) -> std::io::Result<Answer> {
    let mut read = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    let deadline = tokio::time::Instant::now() + wait;
    let mut closed = false;
    loop {
        if let Some(answer) = parse(&read, false) {
            if answer.body.len() >= content_length(&answer) && !closed {
                // The whole answer is here; see whether the server closes.
                match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                    Ok(Ok(0)) => closed = true,
                    Ok(Ok(n)) => panic!("bytes after the answer: {:?}", &buf[..n]),
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {}
                }
                return Ok(parse(&read, closed).unwrap());
            }
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) => {
                closed = true;
                return parse(&read, closed).ok_or_else(|| {
                    std::io::Error::other(format!(
                        "EOF before a whole answer: {:?}",
                        String::from_utf8_lossy(&read)
                    ))
                });
            }
            Ok(Ok(n)) => read.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(std::io::Error::other("no answer in time")),
        }
    }
}

fn content_length(answer: &Answer) -> usize {
    answer.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn parse(read: &[u8], closed: bool) -> Option<Answer> {
    let end = read.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&read[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Answer { status, headers, body: read[end + 4..].to_vec(), closed })
}

/// A 413 with OpenAI's error JSON, `connection: close`, and the connection then closed.
fn assert_too_large(answer: &Answer) {
    assert_eq!(answer.status, 413, "{answer:?}");
    assert_eq!(answer.error_code(), "request_too_large");
    assert_eq!(answer.header("connection"), Some("close"), "{answer:?}");
    assert!(answer.closed, "the connection stays open after the 413");
}

async fn over_the_limit(path: &str, framing: Framing) {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::start(config_for(&mock.url())).await;
    let answer = upload_then_read(proxy.addr, path, framing, OVER_DEFAULT_LIMIT)
        .await
        .unwrap_or_else(|e| panic!("{path}: the client could not finish its upload: {e}"));
    assert_too_large(&answer);
}

#[tokio::test]
async fn chat_upload_over_the_limit_by_content_length_reads_the_413() {
    over_the_limit("/v1/chat/completions", Framing::Length).await;
}

#[tokio::test]
async fn passthrough_upload_over_the_limit_by_content_length_reads_the_413() {
    over_the_limit("/v1/files", Framing::Length).await;
}

#[tokio::test]
async fn chat_chunked_upload_over_the_limit_reads_the_413() {
    over_the_limit("/v1/chat/completions", Framing::Chunked).await;
}

#[tokio::test]
async fn passthrough_chunked_upload_over_the_limit_reads_the_413() {
    over_the_limit("/v1/files", Framing::Chunked).await;
}

#[tokio::test]
async fn upload_to_an_unknown_route_reads_the_404() {
    let mock = MockUpstream::echo().await;
    let mut config = config_for(&mock.url());
    config.server.max_body_size = ByteSize(MIB as u64);
    let proxy = Proxy::start(config).await;
    let answer = upload_then_read(proxy.addr, "/upload", Framing::Length, 2 * MIB).await.unwrap();
    assert_eq!(answer.status, 404, "{answer:?}");
    assert_eq!(answer.error_code(), "unknown_route");
    assert!(answer.closed);
}

/// An upstream that answers 401 as soon as it has the request head, never reads the
/// body, and closes its connection shortly after.
async fn impatient_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = r#"{"error":{"message":"bad key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
                let answer = format!(
                    "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn upload_the_upstream_answered_early_reads_the_upstream_answer() {
    let upstream = impatient_upstream().await;
    let mut config = config_for(&format!("http://{upstream}/v1"));
    config.server.max_body_size = ByteSize(16 * MIB as u64);
    let proxy = Proxy::start(config).await;
    let answer = upload_then_read(proxy.addr, "/v1/files", Framing::Length, 8 * MIB)
        .await
        .unwrap_or_else(|e| panic!("the client could not finish its upload: {e}"));
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.error_code(), "invalid_api_key");
    assert!(answer.closed);
}

#[tokio::test]
async fn error_after_the_whole_body_was_read_keeps_the_connection() {
    // Bind then drop: nothing listens there, so the chat request gets a 502 after its
    // body was read whole.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let proxy = Proxy::to(&format!("http://127.0.0.1:{port}/v1")).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    for _ in 0..2 {
        let body = r#"{"model":"gpt-4o","messages":[]}"#;
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: foldgate\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_answer(&mut stream, Duration::from_millis(300)).await.unwrap();
        assert_eq!(answer.status, 502, "{answer:?}");
        assert_ne!(answer.header("connection"), Some("close"), "{answer:?}");
        assert!(!answer.closed, "a keep-alive connection was closed after an ordinary error");
    }
}

/// Sends body bytes as fast as `pace` allows until a write fails; returns when it failed
/// (since `started`) and how much was written.
async fn send_forever(
    stream: &mut tokio::net::tcp::OwnedWriteHalf,
    pace: Option<Duration>,
) -> (Duration, usize) {
    let started = Instant::now();
    let piece = vec![b'y'; 64 * 1024];
    let mut written = 0;
    loop {
        if stream.write_all(&piece).await.is_err() {
            return (started.elapsed(), written);
        }
        written += piece.len();
        assert!(started.elapsed() < Duration::from_secs(15), "never cut off");
        if let Some(pace) = pace {
            tokio::time::sleep(pace).await;
        }
    }
}

/// Opens a connection that declares a 1 GiB body over a 64 KiB limit, and returns the
/// halves after the 413 was read.
async fn endless_upload() -> (Proxy, tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf)
{
    let mock = MockUpstream::echo().await;
    let mut config = config_for(&mock.url());
    config.server.max_body_size = ByteSize(64 * 1024);
    let proxy = Proxy::start(config).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let head = "POST /v1/files HTTP/1.1\r\nhost: foldgate\r\ncontent-length: 1073741824\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let (read, write) = stream.into_split();
    (proxy, read, write)
}

/// Everything the server sends until it closes or resets the connection.
async fn read_all(mut read: tokio::net::tcp::OwnedReadHalf) -> Vec<u8> {
    let mut answer = Vec::new();
    let _ = read.read_to_end(&mut answer).await;
    answer
}

#[tokio::test]
async fn client_sending_forever_fast_is_cut_off_after_the_byte_bound() {
    let (_proxy, read, mut write) = endless_upload().await;
    let reader = tokio::spawn(read_all(read));
    let (after, written) = send_forever(&mut write, None).await;
    // The bound is the limit plus 4 MiB; socket buffers hold some more.
    assert!(written >= 4 * MIB, "cut off after {written} bytes");
    assert!(after < Duration::from_secs(3), "cut off only after {after:?}");
    let answer = parse(&reader.await.unwrap(), true).expect("an answer before the cut");
    assert_eq!(answer.status, 413);
}

#[tokio::test]
async fn client_sending_forever_slowly_is_cut_off_after_the_time_bound() {
    let (_proxy, read, mut write) = endless_upload().await;
    let reader = tokio::spawn(read_all(read));
    // 64 KiB every 100 ms: about 3 MiB in 5 s, short of the byte bound, so the time
    // bound ends the linger.
    let (after, written) = send_forever(&mut write, Some(Duration::from_millis(100))).await;
    assert!(written < 4 * MIB, "the byte bound ended it ({written} bytes)");
    assert!(
        (Duration::from_secs(4)..Duration::from_secs(8)).contains(&after),
        "cut off after {after:?}, expected about 5 s"
    );
    let answer = parse(&reader.await.unwrap(), true).expect("an answer before the cut");
    assert_eq!(answer.status, 413);
}
