//! Test harness: a mock upstream that is a real hyper server, foldgate on port 0,
//! and a plain HTTP client, all over loopback.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use foldgate::config::Config;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

pub mod agent;
pub mod binary;
pub mod messages_api;
pub mod priced;
pub mod redis_server;
pub mod redis_sharing;
pub mod redis_topology;
pub mod responses_api;
pub mod sessions;
pub mod tools;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type TestBody = UnsyncBoxBody<Bytes, BoxError>;
pub type Handler =
    Arc<dyn Fn(Recorded) -> Pin<Box<dyn Future<Output = Response<TestBody>> + Send>> + Send + Sync>;

/// What the mock upstream received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub fn full(bytes: impl Into<Bytes>) -> TestBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

/// A body fed chunk by chunk through the returned sender.
pub fn channel_body() -> (mpsc::Sender<Result<Frame<Bytes>, BoxError>>, TestBody) {
    let (tx, rx) = mpsc::channel(16);
    let stream = tokio_stream_from(rx);
    (tx, StreamBody::new(stream).boxed_unsync())
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

pub fn response(status: u16, body: impl Into<Bytes>) -> Response<TestBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r
}

/// A real hyper server on 127.0.0.1:0 that records every request (body read whole).
pub struct MockUpstream {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    /// Connections accepted so far.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections that have ended so far.
    pub closed: Arc<std::sync::atomic::AtomicUsize>,
    _shutdown: oneshot::Sender<()>,
}

impl MockUpstream {
    pub async fn start(handler: Handler) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = oneshot::channel::<()>();
        let recorded = requests.clone();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = connections.clone();
        let closed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ended = closed.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    a = listener.accept() => a.unwrap(),
                    _ = &mut rx => return,
                };
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let handler = handler.clone();
                let recorded = recorded.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let handler = handler.clone();
                    let recorded = recorded.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                        let rec = Recorded {
                            method: parts.method,
                            uri: parts.uri,
                            headers: parts.headers,
                            body,
                        };
                        recorded.lock().unwrap().push(rec.clone());
                        Ok::<_, Infallible>(handler(rec).await)
                    }
                });
                let ended = ended.clone();
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        });
        Self { addr, requests, connections, closed, _shutdown: tx }
    }

    /// A mock that echoes the request body with status 200.
    pub async fn echo() -> Self {
        Self::start(Arc::new(|rec: Recorded| {
            Box::pin(async move {
                let mut r = response(200, rec.body.clone());
                r.headers_mut().insert("x-upstream", "mock".parse().unwrap());
                r
            })
        }))
        .await
    }

    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests clients sent through foldgate, in order (not foldgate's own
    /// summarization calls, which carry `x-foldgate-summary`).
    pub fn forwarded(&self) -> Vec<Recorded> {
        let all = self.recorded().into_iter();
        all.filter(|r| !r.headers.contains_key("x-foldgate-summary")).collect()
    }

    /// The bodies of [`MockUpstream::forwarded`].
    pub fn forwarded_bodies(&self) -> Vec<Bytes> {
        self.forwarded().into_iter().map(|r| r.body).collect()
    }
}

/// foldgate serving in this process on 127.0.0.1:0.
pub struct Proxy {
    pub addr: SocketAddr,
    /// The separate metrics listener, when `metrics.listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    /// The session inspector's listener, when `admin.listen` is set.
    pub admin_addr: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(mut config: Config) -> Self {
        config.server.listen = "127.0.0.1:0".parse().unwrap();
        let server = foldgate::app::build_server(&config).await.unwrap();
        let addr = server.local_addr().unwrap();
        let metrics_addr = server.metrics_addr();
        let admin_addr = server.admin_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        Self { addr, metrics_addr, admin_addr, shutdown: Some(tx), task: Some(task) }
    }

    pub async fn to(upstream_url: &str) -> Self {
        Self::start(config_for(upstream_url)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Starts graceful shutdown; `task` finishes when it is done.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub fn config_for(upstream_url: &str) -> Config {
    let mut config = Config::default();
    config.upstream.url = upstream_url.to_owned();
    config.server.shutdown_grace = Duration::from_secs(5);
    config
}

pub fn client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Sends a request and reads the whole response.
pub async fn send(request: Request<TestBody>) -> (StatusCode, HeaderMap, Bytes) {
    let response = client().request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
}

/// Opens a streamed chat request at `url` (200 expected) and reads its first chunk;
/// returns the chunk and the rest of the body.
pub async fn open_stream(url: &str) -> (Bytes, Incoming) {
    let response = client().request(post(url, r#"{"stream":true}"#)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    (first, body)
}

pub fn post(url: &str, body: impl Into<Bytes>) -> Request<TestBody> {
    Request::post(url).header("content-type", "application/json").body(full(body)).unwrap()
}

pub fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}
