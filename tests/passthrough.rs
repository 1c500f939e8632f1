//! Passthrough: every route reaches the upstream and every answer comes back unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;

#[tokio::test]
async fn json_body_and_end_to_end_headers_pass_through() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"zzz":1,"aaa":2}"#;
    let request = Request::post(proxy.url("/v1/chat/completions?api-version=2024"))
        .header("authorization", "Bearer sk-test-123")
        .header("openai-organization", "org-42")
        .header("openai-project", "proj-7")
        .header("content-type", "application/json")
        .header("x-custom", "kept")
        .body(full(body))
        .unwrap();
    let (status, headers, got) = send(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got, body.as_bytes(), "response body byte-identical");
    assert_eq!(headers["x-upstream"], "mock", "upstream headers come back");
    assert!(headers.contains_key("x-request-id"));

    let seen = &mock.recorded()[0];
    assert_eq!(seen.body, body.as_bytes(), "request body byte-identical");
    assert_eq!(seen.uri.path(), "/v1/chat/completions");
    assert_eq!(seen.uri.query(), Some("api-version=2024"));
    assert_eq!(seen.headers["authorization"], "Bearer sk-test-123");
    assert_eq!(seen.headers["openai-organization"], "org-42");
    assert_eq!(seen.headers["openai-project"], "proj-7");
    assert_eq!(seen.headers["x-custom"], "kept");
    assert_eq!(seen.headers["host"], mock.addr.to_string(), "Host is the upstream's");
    assert_eq!(seen.headers["x-request-id"], headers["x-request-id"]);
}

#[tokio::test]
async fn every_method_and_a_base_path_prefix_are_forwarded() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&format!("http://{}/api/v1", mock.addr)).await;
    for method in ["GET", "DELETE", "PUT", "PATCH", "POST"] {
        let request = Request::builder()
            .method(method)
            .uri(proxy.url("/v1/files/file-abc?limit=2"))
            .body(full(Bytes::new()))
            .unwrap();
        let (status, _, _) = send(request).await;
        assert_eq!(status, StatusCode::OK, "{method}");
    }
    let recorded = mock.recorded();
    assert_eq!(recorded.len(), 5);
    for (rec, method) in recorded.iter().zip(["GET", "DELETE", "PUT", "PATCH", "POST"]) {
        assert_eq!(rec.method.as_str(), method);
        assert_eq!(rec.uri.to_string(), "/api/v1/files/file-abc?limit=2");
    }
}

#[tokio::test]
async fn five_megabyte_binary_body_is_byte_identical_both_ways() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let payload: Vec<u8> =
        (0..5_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let request = Request::post(proxy.url("/v1/files"))
        .header("content-type", "application/octet-stream")
        .body(full(payload.clone()))
        .unwrap();
    let (status, _, got) = send(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(mock.recorded()[0].body.len(), payload.len());
    assert!(mock.recorded()[0].body == payload, "upstream got the exact bytes");
    assert!(got == payload, "client got the exact bytes back");
}

#[tokio::test]
async fn upstream_error_statuses_headers_and_bodies_pass_through() {
    for (status, body) in [
        (
            400u16,
            r#"{"error":{"message":"bad","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        ),
        (401, r#"{"error":{"message":"no key"}}"#),
        (404, r#"{"error":{"message":"model not found"}}"#),
        (429, r#"{"error":{"message":"slow down"}}"#),
        (500, "plain text failure"),
        (503, ""),
    ] {
        let mock = MockUpstream::start(Arc::new(move |_| {
            Box::pin(async move {
                let mut r = response(status, body);
                r.headers_mut().insert("retry-after", "7".parse().unwrap());
                r
            })
        }))
        .await;
        let proxy = Proxy::to(&mock.url()).await;
        let (got_status, headers, got) = send(post(&proxy.url("/v1/chat/completions"), "{}")).await;
        assert_eq!(got_status.as_u16(), status);
        assert_eq!(headers["retry-after"], "7");
        assert_eq!(got, body.as_bytes());
    }
}

#[tokio::test]
async fn server_sent_events_arrive_chunk_by_chunk() {
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let mock = MockUpstream::start(Arc::new(move |_| {
        let release_rx = release_rx.clone();
        Box::pin(async move {
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                tx.send(Ok(Frame::data(Bytes::from("data: {\"n\":1}\n\n")))).await.unwrap();
                // The last chunk is only sent once the client has seen the first.
                let rx = release_rx.lock().await.take().unwrap();
                rx.await.unwrap();
                tx.send(Ok(Frame::data(Bytes::from("data: [DONE]\n\n")))).await.unwrap();
            });
            let mut r = http::Response::new(body);
            r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            r
        })
    }))
    .await;
    let proxy = Proxy::to(&mock.url()).await;
    let response = client()
        .request(post(&proxy.url("/v1/chat/completions"), r#"{"stream":true}"#))
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first chunk arrives before the upstream sent the last one")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(first, "data: {\"n\":1}\n\n");
    release_tx.send(()).unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "data: [DONE]\n\n");
}

#[tokio::test]
async fn hop_by_hop_headers_are_not_forwarded() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let request = Request::post(proxy.url("/v1/embeddings"))
        .header("connection", "x-hop")
        .header("x-hop", "1")
        .header("proxy-authorization", "Basic secret")
        .header("te", "trailers")
        .header("x-end-to-end", "1")
        .body(full("{}"))
        .unwrap();
    send(request).await;
    let seen = &mock.recorded()[0];
    assert!(!seen.headers.contains_key("x-hop"));
    assert!(!seen.headers.contains_key("proxy-authorization"));
    assert!(!seen.headers.contains_key("te"));
    assert_eq!(seen.headers["x-end-to-end"], "1");
}

#[tokio::test]
async fn request_id_is_kept_when_given_and_generated_otherwise() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let given = Request::get(proxy.url("/v1/models"))
        .header("x-request-id", "req-abc-1")
        .body(full(Bytes::new()))
        .unwrap();
    let (_, headers, _) = send(given).await;
    assert_eq!(headers["x-request-id"], "req-abc-1");
    assert_eq!(mock.recorded()[0].headers["x-request-id"], "req-abc-1");

    let (_, headers, _) =
        send(Request::get(proxy.url("/v1/models")).body(full(Bytes::new())).unwrap()).await;
    let generated = headers["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(generated.len(), 36, "a hyphenated UUID: {generated}");
    assert_eq!(&generated[14..15], "7", "version 7: {generated}");
    assert_eq!(mock.recorded()[1].headers["x-request-id"], generated.as_str());
    assert_eq!(headers["x-foldgate-request-id"], generated.as_str());
}

/// An upstream that names its answers like OpenAI does (`x-request-id: req_...`).
fn upstream_with_request_ids() -> Handler {
    Arc::new(|rec: Recorded| {
        Box::pin(async move {
            let streamed = rec.body.windows(14).any(|w| w == b"\"stream\":true");
            let mut r = if streamed {
                response(200, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
            } else {
                response(200, r#"{"choices":[]}"#)
            };
            let id = format!("req_{}", rec.uri.path().len() + rec.body.len());
            r.headers_mut().insert("x-request-id", id.parse().unwrap());
            r
        })
    })
}

#[tokio::test]
async fn the_upstreams_request_id_reaches_the_client_and_ours_is_beside_it() {
    let mock = MockUpstream::start(upstream_with_request_ids()).await;
    let proxy = Proxy::to(&mock.url()).await;
    let cases = [
        ("/v1/models", None),
        (
            "/v1/chat/completions",
            Some(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#),
        ),
        (
            "/v1/chat/completions",
            Some(r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#),
        ),
    ];
    for (i, (path, body)) in cases.into_iter().enumerate() {
        let request = match body {
            Some(b) => post(&proxy.url(path), b),
            None => Request::get(proxy.url(path)).body(full(Bytes::new())).unwrap(),
        };
        let (status, headers, _) = send(request).await;
        assert_eq!(status, StatusCode::OK);
        let seen = &mock.recorded()[i];
        let upstream_id = format!("req_{}", seen.uri.path().len() + seen.body.len());
        assert_eq!(headers["x-request-id"], upstream_id.as_str(), "{path}: the upstream's id");
        let ours = headers["x-foldgate-request-id"].to_str().unwrap();
        assert_eq!(seen.headers["x-request-id"], ours, "{path}: ours went upstream");
        assert_ne!(ours, upstream_id);
    }
    // An answer of foldgate's own carries its id in both headers.
    let (status, headers, _) =
        send(Request::get(proxy.url("/nowhere")).body(full(Bytes::new())).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(headers["x-request-id"], headers["x-foldgate-request-id"]);
}

#[tokio::test]
async fn health_readiness_and_unknown_routes() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let get = |p: &str| Request::get(proxy.url(p)).body(full(Bytes::new())).unwrap();
    assert_eq!(send(get("/healthz")).await.0, StatusCode::OK);
    assert_eq!(send(get("/readyz")).await.0, StatusCode::OK);
    let (status, _, body) = send(get("/chat/completions")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let v = json(&body);
    assert_eq!(v["error"]["code"], "unknown_route");
    assert!(v["error"]["message"].as_str().unwrap().contains("/v1"));
    assert!(mock.recorded().is_empty(), "local routes never reach the upstream");
}

#[tokio::test]
async fn http2_clients_are_served() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<TestBody>();
    let response =
        h2.request(post(&proxy.url("/v1/chat/completions"), "{\"h2\":true}")).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "{\"h2\":true}");
    // A chat turn over HTTP/2 is tagged as over HTTP/1.1: the tags go into the map
    // hyper's HTTP/2 server writes.
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let response = h2.request(post(&proxy.url("/v1/chat/completions"), chat)).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let headers = response.headers();
    assert_eq!(headers["x-foldgate-outcome"], "passthrough", "{headers:?}");
    assert_eq!(headers["x-foldgate-tokens-before"], headers["x-foldgate-tokens-after"]);
    assert!(headers.contains_key("x-foldgate-session"), "{headers:?}");
    let id = &headers["x-foldgate-request-id"];
    assert_eq!(&headers["x-request-id"], id, "the echo upstream sends no id of its own");
}

#[tokio::test]
async fn sequential_requests_reuse_one_upstream_connection() {
    let mock = MockUpstream::start(Arc::new(|rec: Recorded| {
        Box::pin(async move {
            match rec.uri.path() {
                // Bodies that end before they start: the connection must still come back.
                "/v1/empty" => response(204, Bytes::new()),
                _ => response(200, rec.body),
            }
        })
    }))
    .await;
    let proxy = Proxy::to(&mock.url()).await;
    for i in 0..10 {
        let (status, _, body) = send(post(&proxy.url("/v1/embeddings"), format!("{i}"))).await;
        assert_eq!((status, body), (StatusCode::OK, Bytes::from(format!("{i}"))));
        let (status, _, _) = send(post(&proxy.url("/v1/empty"), "x")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let head = Request::head(proxy.url("/v1/models")).body(full(Bytes::new())).unwrap();
        assert_eq!(send(head).await.0, StatusCode::OK);
    }
    assert_eq!(mock.recorded().len(), 30);
    assert_eq!(mock.connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A raw TCP upstream on 127.0.0.1, each connection served by `serve`: its URL and how
/// many connections it accepted.
async fn raw_upstream<F, Fut>(serve: F) -> (String, Arc<std::sync::atomic::AtomicUsize>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(serve(stream));
        }
    });
    (url, accepted)
}

/// An upstream that answers each connection's first request, then closes it without
/// saying so (as a server whose keep-alive timeout runs out does, a moment later).
async fn closing_upstream() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw_upstream(|mut stream| async move {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let _ = stream.write_all(answer.as_bytes()).await;
    })
    .await
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_replaced_without_an_error() {
    let (url, accepted) = closing_upstream().await;
    let proxy = Proxy::to(&url).await;
    for round in 0..4 {
        let (status, _, body) = send(post(&proxy.url("/v1/embeddings"), "{}")).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]), "round {round}");
        // The pool must notice the close and open a new connection, not fail.
        tokio::time::sleep(Duration::from_millis(if round % 2 == 0 { 20 } else { 2 })).await;
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 4);
}

#[tokio::test]
async fn an_idle_upstream_connection_is_closed_after_the_idle_timeout() {
    use std::sync::atomic::Ordering::SeqCst;
    let mock = MockUpstream::echo().await;
    let mut config = config_for(&mock.url());
    config.upstream.pool_idle_timeout = Duration::from_millis(300);
    let proxy = Proxy::start(config).await;
    assert_eq!(send(post(&proxy.url("/v1/embeddings"), "{}")).await.0, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!((mock.connections.load(SeqCst), mock.closed.load(SeqCst)), (1, 0), "kept idle");
    // Closed by the next once-a-second sweep after the timeout.
    let waited = std::time::Instant::now();
    while mock.closed.load(SeqCst) == 0 && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mock.closed.load(SeqCst), 1, "idle connection closed");
    assert!(waited.elapsed() < Duration::from_millis(1500), "{:?}", waited.elapsed());
}

/// An upstream that answers by the request path, as raw bytes: a chunked body with
/// trailers and an interim 103, a close-delimited HTTP/1.0 body, or a length; it counts
/// connections and the requests each carried.
async fn framing_upstream() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw_upstream(|mut stream| async move {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // One request at a time: its head, then its body (content-length).
            let end = loop {
                if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            };
            let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            while seen.len() < end + length {
                let n = stream.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
            seen.drain(..end + length);
            let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
            let answer: &[u8] = match path.as_str() {
                "/v1/chunked" => {
                    b"HTTP/1.1 103 Early Hints\r\nlink: </s>\r\n\r\n\
                    HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n\
                    5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-sum: 12\r\n\r\n"
                }
                "/v1/reason" => b"HTTP/1.1 429 Slow Down\r\ncontent-length: 4\r\n\r\nwait",
                "/v1/until-close" => {
                    b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end"
                }
                _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            };
            stream.write_all(answer).await.unwrap();
            if path == "/v1/until-close" {
                return;
            }
        }
    })
    .await
}

#[tokio::test]
async fn chunked_and_close_delimited_answers_pass_through_and_only_reusable_connections_stay() {
    use std::sync::atomic::Ordering::SeqCst;
    let (url, accepted) = framing_upstream().await;
    let proxy = Proxy::to(&url).await;
    for _ in 0..3 {
        let (status, headers, body) = send(post(&proxy.url("/v1/chunked"), "{}")).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello, world"[..]));
        assert!(headers.get("link").is_none(), "the interim answer stays with foldgate");
    }
    assert_eq!(accepted.load(SeqCst), 1, "a chunked answer leaves its connection reusable");
    for round in 0..2 {
        let (status, _, body) = send(post(&proxy.url("/v1/until-close"), "{}")).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"to the end"[..]), "round {round}");
    }
    let (status, _, body) = send(post(&proxy.url("/v1/length"), "{}")).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    // The upstream's own reason phrase reaches the client.
    let response = client().request(post(&proxy.url("/v1/reason"), "{}")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let reason = response.extensions().get::<hyper::ext::ReasonPhrase>().map(|r| r.as_bytes());
    assert_eq!(reason, Some(&b"Slow Down"[..]));
    // Each close-delimited answer took its connection with it.
    assert_eq!(accepted.load(SeqCst), 3);
}
