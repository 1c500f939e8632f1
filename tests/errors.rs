//! Errors foldgate produces itself: OpenAI-style JSON with the right status.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use foldgate::config::ByteSize;
use http::{Request, StatusCode};
use hyper::body::Frame;

fn assert_openai_error(body: &[u8], code: &str) {
    let v = json(body);
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
}

#[tokio::test]
async fn body_over_the_limit_by_content_length_is_413_without_reaching_upstream() {
    let mock = MockUpstream::echo().await;
    let mut config = config_for(&mock.url());
    config.server.max_body_size = ByteSize(1024);
    let proxy = Proxy::start(config).await;
    let (status, headers, body) =
        send(post(&proxy.url("/v1/chat/completions"), vec![b'x'; 2048])).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(headers["content-type"], "application/json");
    assert_openai_error(&body, "request_too_large");
    assert!(mock.recorded().is_empty());

    let (status, _, _) = send(post(&proxy.url("/v1/chat/completions"), vec![b'x'; 1024])).await;
    assert_eq!(status, StatusCode::OK, "a body at the limit passes");
}

#[tokio::test]
async fn chunked_body_over_the_limit_is_413() {
    let mock = MockUpstream::echo().await;
    let mut config = config_for(&mock.url());
    config.server.max_body_size = ByteSize(10_000);
    let proxy = Proxy::start(config).await;
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        for _ in 0..20 {
            if tx.send(Ok(Frame::data(Bytes::from(vec![b'y'; 1000])))).await.is_err() {
                break;
            }
        }
    });
    let request = Request::post(proxy.url("/v1/files")).body(body).unwrap();
    let (status, _, body) = send(request).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_openai_error(&body, "request_too_large");
}

#[tokio::test]
async fn unreachable_upstream_is_502() {
    // Bind then drop: nothing listens on this port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let proxy = Proxy::to(&format!("http://127.0.0.1:{port}/v1")).await;
    let (status, _, body) = send(post(&proxy.url("/v1/chat/completions"), "{}")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_openai_error(&body, "upstream_unreachable");
}

#[tokio::test]
async fn upstream_slower_than_first_byte_timeout_is_504() {
    let mock = MockUpstream::start(Arc::new(|_| {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            response(200, "late")
        })
    }))
    .await;
    let mut config = config_for(&mock.url());
    config.upstream.first_byte_timeout = Duration::from_millis(300);
    let proxy = Proxy::start(config).await;
    let started = std::time::Instant::now();
    let (status, _, body) = send(post(&proxy.url("/v1/chat/completions"), "{}")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_openai_error(&body, "upstream_timeout");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A mock that streams an endless SSE response and reports when its client is gone.
async fn endless_stream(cancelled: Arc<AtomicBool>) -> MockUpstream {
    MockUpstream::start(Arc::new(move |_| {
        let cancelled = cancelled.clone();
        Box::pin(async move {
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                for i in 0.. {
                    let chunk = Bytes::from(format!("data: {{\"n\":{i}}}\n\n"));
                    if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                        cancelled.store(true, Ordering::SeqCst);
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            http::Response::new(body)
        })
    }))
    .await
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_stream() {
    let cancelled = Arc::new(AtomicBool::new(false));
    let mock = endless_stream(cancelled.clone()).await;
    let proxy = Proxy::to(&mock.url()).await;
    let (_, body) = open_stream(&proxy.url("/v1/chat/completions")).await;
    drop(body);
    for _ in 0..100 {
        if cancelled.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the upstream stream was still being read 5 s after the client left");
}

#[tokio::test]
async fn client_disconnect_before_response_headers_cancels_the_upstream_request() {
    let dropped = Arc::new(AtomicBool::new(false));
    struct OnDrop(Arc<AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = dropped.clone();
    let mock = MockUpstream::start(Arc::new(move |_| {
        let guard = OnDrop(flag.clone());
        Box::pin(async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_secs(30)).await;
            response(200, "never")
        })
    }))
    .await;
    let proxy = Proxy::to(&mock.url()).await;
    let url = proxy.url("/v1/chat/completions");
    let request = tokio::spawn(async move {
        client().request(post(&url, "{}")).await.ok();
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mock.recorded().len(), 1, "the request reached the upstream");
    request.abort();
    for _ in 0..100 {
        if dropped.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the upstream request was still pending 5 s after the client left");
}

#[tokio::test]
async fn upstream_that_never_completes_the_connection_is_504() {
    // A listener whose accept queue is full and never drained: further SYNs are
    // dropped, so connecting hangs until upstream.connect_timeout.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    let _listener = socket.listen(1).unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(addr))
                .await
        {
            fillers.push(s);
        } else {
            break;
        }
    }
    let mut config = config_for(&format!("http://{addr}/v1"));
    config.upstream.connect_timeout = Duration::from_millis(300);
    let proxy = Proxy::start(config).await;
    let (status, _, body) = send(post(&proxy.url("/v1/chat/completions"), "{}")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{}", String::from_utf8_lossy(&body));
    assert_openai_error(&body, "upstream_timeout");
    assert!(String::from_utf8_lossy(&body).contains("connect_timeout"));
}
