//! The upstream connections of one server: connect (TCP, TLS, ALPN), keep idle HTTP/1.1
//! connections for reuse, share one HTTP/2 connection, and take an HTTP/1.1 connection
//! back when its response has been read to the end.
//!
//! Every connection thread has a pool of its own, so a check-out is an uncontended lock
//! and a `Vec::pop`, and a connection comes back from the response body's last frame
//! instead of from a task spawned per request (what hyper-util's pooled client does).
//! HTTP/1.1 exchanges run in the request's task (`super::wire`); HTTP/2 ones through
//! hyper's client and the connection task it needs.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Response, Uri, Version, header};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tower::ServiceExt;

use super::body::{BoxError, ProxyBody};
use super::wire::{self, UpstreamRequest};

/// An upstream HTTP/1.1 connection's transport (TCP, or TLS over TCP). Boxed: the
/// exchange moves the connection into and out of the request's future, and a TLS
/// session is large.
type Transport = Box<TokioIo<MaybeHttpsStream<TokioIo<TcpStream>>>>;

/// Why a request could not be exchanged with the upstream.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (TCP connect, its timeout, TLS).
    #[error("cannot connect")]
    Connect(#[source] Box<dyn StdError + Send + Sync>),
    /// The connection was made but the HTTP/2 exchange failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The connection was made but the HTTP/1.1 exchange failed.
    #[error(transparent)]
    Wire(#[from] wire::Error),
}

/// Connections to one upstream, owned by one server.
pub struct ConnectionPool {
    connector: HttpsConnector<HttpConnector>,
    /// `scheme://authority/`, what the connector dials and what HTTP/2 URIs are built on.
    origin: Uri,
    /// The `Host` header HTTP/1.1 requests carry (no port when it is the scheme's default).
    host: HeaderValue,
    /// Idle HTTP/1.1 connections, most recently used last.
    idle: Mutex<Vec<IdleConnection>>,
    /// The HTTP/2 connection, when the upstream negotiated `h2`; streams share it.
    shared: Mutex<Option<http2::SendRequest<ProxyBody>>>,
    idle_timeout: Duration,
    max_idle: usize,
}

struct IdleConnection {
    connection: wire::Connection<Transport>,
    since: Instant,
}

impl IdleConnection {
    /// Idle for less than `timeout` at `now`, and still open.
    fn usable(&mut self, now: Instant, timeout: Duration) -> bool {
        now.duration_since(self.since) < timeout && self.connection.is_open()
    }
}

/// A connection checked out for one request.
enum Checkout {
    Http1 { connection: wire::Connection<Transport>, reused: bool },
    Http2 { sender: http2::SendRequest<ProxyBody>, reused: bool },
}

impl ConnectionPool {
    /// A pool dialing `scheme://authority` through `connector`; idle HTTP/1.1 connections
    /// are kept for `idle_timeout`, at most `max_idle` of them.
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        scheme: Scheme,
        authority: Authority,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Result<Self, http::Error> {
        let origin = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()?;
        let default_port = if scheme == Scheme::HTTPS { 443 } else { 80 };
        let host = match authority.port_u16() {
            Some(port) if port != default_port => HeaderValue::from_str(authority.as_str())?,
            _ => HeaderValue::from_str(authority.host())?,
        };
        Ok(Self {
            connector,
            origin,
            host,
            idle: Mutex::new(Vec::new()),
            shared: Mutex::new(None),
            idle_timeout,
            max_idle,
        })
    }

    /// Sends `request`, whose URI is in origin form (`/path?query`), and waits for the
    /// response head. A request that a reused connection closed before it was written
    /// is sent again on a new connection.
    pub async fn send(
        self: &Arc<Self>,
        mut request: UpstreamRequest,
    ) -> Result<Response<UpstreamBody>, SendError> {
        loop {
            match self.checkout().await? {
                Checkout::Http1 { connection, reused } => {
                    request.headers_mut().insert(header::HOST, self.host.clone());
                    match connection.send(request).await {
                        Ok(response) => {
                            let pool = Arc::clone(self);
                            return Ok(response.map(|body| UpstreamBody::http1(body, pool)));
                        }
                        // Not written: the connection closed while idle. Try a new one.
                        Err(wire::Failed { unsent: Some(unsent), .. }) if reused => {
                            request = unsent;
                        }
                        Err(failed) => return Err(failed.error.into()),
                    }
                }
                Checkout::Http2 { mut sender, reused } => {
                    *request.version_mut() = Version::HTTP_2;
                    *request.uri_mut() = self.absolute(request.uri());
                    request.headers_mut().remove(header::HOST);
                    match sender.try_send_request(*request).await {
                        Ok(response) => return Ok(response.map(UpstreamBody::http2)),
                        Err(mut error) => {
                            self.forget_closed_shared();
                            match error.take_message() {
                                // Not written: the connection closed. Try a new one.
                                Some(unsent) if reused => {
                                    request = Box::new(unsent);
                                    if let Some(path) = request.uri().path_and_query().cloned() {
                                        *request.uri_mut() = Uri::from(path);
                                    }
                                }
                                _ => return Err(error.into_error().into()),
                            }
                        }
                    }
                }
            }
        }
    }

    /// An idle or shared connection that is ready, or a new one.
    async fn checkout(self: &Arc<Self>) -> Result<Checkout, SendError> {
        let shared = lock(&self.shared).clone();
        if let Some(mut sender) = shared {
            if sender.ready().await.is_ok() {
                return Ok(Checkout::Http2 { sender, reused: true });
            }
            self.forget_closed_shared();
        }
        if let Some(connection) = self.take_idle() {
            return Ok(Checkout::Http1 { connection, reused: true });
        }
        // Boxed: connecting is rare, and its state would otherwise enlarge every
        // request's future (which is moved, byte for byte, when it is boxed).
        Box::pin(self.connect()).await
    }

    /// The most recently used idle connection that is still open and not expired.
    fn take_idle(&self) -> Option<wire::Connection<Transport>> {
        let mut idle = lock(&self.idle);
        let now = Instant::now();
        while let Some(mut c) = idle.pop() {
            if c.usable(now, self.idle_timeout) {
                return Some(c.connection);
            }
        }
        None
    }

    /// Drops idle connections that are closed or older than the idle timeout (dropping
    /// the sender ends the connection). The owning server calls this every second.
    pub fn close_expired(&self) {
        let now = Instant::now();
        lock(&self.idle).retain_mut(|c| c.usable(now, self.idle_timeout));
    }

    /// Keeps `connection` for the next request, unless the pool is full.
    fn put(&self, connection: wire::Connection<Transport>) {
        let mut idle = lock(&self.idle);
        if idle.len() < self.max_idle {
            idle.push(IdleConnection { connection, since: Instant::now() });
        }
    }

    /// Drops the shared HTTP/2 connection once it has closed.
    fn forget_closed_shared(&self) {
        let mut shared = lock(&self.shared);
        if shared.as_ref().is_some_and(http2::SendRequest::is_closed) {
            *shared = None;
        }
    }

    /// The upstream's scheme and authority.
    pub fn origin(&self) -> &Uri {
        &self.origin
    }

    async fn connect(self: &Arc<Self>) -> Result<Checkout, SendError> {
        let io = self
            .connector
            .clone()
            .oneshot(self.origin.clone())
            .await
            .map_err(SendError::Connect)?;
        if io.connected().is_negotiated_h2() {
            let (mut sender, connection) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
                }
            });
            sender.ready().await?;
            *lock(&self.shared) = Some(sender.clone());
            Ok(Checkout::Http2 { sender, reused: false })
        } else {
            let connection = wire::Connection::new(Box::new(TokioIo::new(io)));
            Ok(Checkout::Http1 { connection, reused: false })
        }
    }

    /// `uri` (origin form) as an absolute URI on the upstream, as HTTP/2 needs it.
    fn absolute(&self, uri: &Uri) -> Uri {
        let mut parts = http::uri::Parts::default();
        parts.scheme = self.origin.scheme().cloned();
        parts.authority = self.origin.authority().cloned();
        parts.path_and_query =
            Some(uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")));
        Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values stay consistent even if a holder panicked.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An upstream response body; at its end, its HTTP/1.1 connection goes back to the pool.
/// Dropped before its end, it takes the connection with it, which closes it.
pub struct UpstreamBody {
    inner: Inner,
}

enum Inner {
    Http1 { body: wire::ResponseBody<Transport>, pool: Arc<ConnectionPool> },
    Http2(Incoming),
}

impl UpstreamBody {
    fn http1(body: wire::ResponseBody<Transport>, pool: Arc<ConnectionPool>) -> Self {
        Self { inner: Inner::Http1 { body, pool } }
    }

    fn http2(body: Incoming) -> Self {
        Self { inner: Inner::Http2(body) }
    }

    /// Gives the connection back once the body has ended.
    fn release(&mut self) {
        if let Inner::Http1 { body, pool } = &mut self.inner
            && let Some(connection) = body.reusable()
        {
            pool.put(connection);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.inner {
            Inner::Http1 { body, .. } => {
                let polled = Pin::new(&mut *body).poll_frame(cx);
                let ended = match &polled {
                    Poll::Ready(None) => true,
                    Poll::Ready(Some(Ok(_))) => body.is_end_stream(),
                    _ => false,
                };
                if ended {
                    self.release();
                }
                polled.map_err(Into::into)
            }
            Inner::Http2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Http1 { body, .. } => body.is_end_stream(),
            Inner::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Http1 { body, .. } => body.size_hint(),
            Inner::Http2(body) => body.size_hint(),
        }
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // An empty body (HEAD, 204, 304) may be dropped without ever being polled.
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamConfig;
    use http::Request;

    fn pool(scheme: Scheme, authority: &str) -> ConnectionPool {
        let connector = crate::client::https_connector(&UpstreamConfig::default()).unwrap();
        ConnectionPool::new(connector, scheme, authority.parse().unwrap(), Duration::ZERO, 1)
            .unwrap()
    }

    #[test]
    fn host_omits_only_the_schemes_default_port() {
        assert_eq!(pool(Scheme::HTTPS, "api.openai.com").host, "api.openai.com");
        assert_eq!(pool(Scheme::HTTPS, "api.openai.com:443").host, "api.openai.com");
        assert_eq!(pool(Scheme::HTTP, "localhost:80").host, "localhost");
        assert_eq!(pool(Scheme::HTTP, "localhost:11434").host, "localhost:11434");
        assert_eq!(pool(Scheme::HTTPS, "gw.example:8443").host, "gw.example:8443");
    }

    #[test]
    fn http2_requests_carry_the_absolute_uri() {
        let p = pool(Scheme::HTTPS, "openrouter.ai");
        let origin = Uri::from_static("/api/v1/chat/completions?a=1");
        assert_eq!(
            p.absolute(&origin).to_string(),
            "https://openrouter.ai/api/v1/chat/completions?a=1"
        );
    }

    /// What the HTTP/2 upstream saw of one request.
    #[derive(Debug)]
    struct Seen {
        version: Version,
        authority: Option<String>,
        host: Option<HeaderValue>,
        path: String,
    }

    /// A TLS upstream on 127.0.0.1 that offers only `alpn` (`h2` or `http/1.1`) and
    /// echoes request bodies, with a certificate for `localhost`, and a connector that
    /// trusts it.
    async fn tls_upstream(
        alpn: &'static [u8],
    ) -> (
        u16,
        HttpsConnector<HttpConnector>,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<Mutex<Vec<Seen>>>,
    ) {
        use http_body_util::BodyExt;
        use hyper_util::rt::TokioIo;
        use rustls::pki_types::PrivateKeyDer;

        let rcgen::CertifiedKey { cert, key_pair } =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let key = PrivateKeyDer::Pkcs8(key_pair.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        server.alpn_protocols = vec![alpn.to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (count, record) = (accepted.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (acceptor, record) = (acceptor.clone(), record.clone());
                tokio::spawn(async move {
                    let tls = acceptor.accept(tcp).await.unwrap();
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let record = record.clone();
                        async move {
                            lock(&record).push(Seen {
                                version: request.version(),
                                authority: request.uri().authority().map(ToString::to_string),
                                host: request.headers().get(header::HOST).cloned(),
                                path: request.uri().path_and_query().unwrap().to_string(),
                            });
                            let body = request.into_body().collect().await?.to_bytes();
                            Ok::<_, hyper::Error>(Response::new(http_body_util::Full::new(body)))
                        }
                    });
                    if alpn == b"h2" {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    }
                });
            }
        });

        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client)
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(http);
        (port, connector, accepted, seen)
    }

    #[tokio::test]
    async fn an_upstream_that_negotiates_h2_gets_every_request_on_one_connection() {
        use http_body_util::BodyExt;

        let (port, connector, accepted, seen) = tls_upstream(b"h2").await;
        let authority: Authority = format!("localhost:{port}").parse().unwrap();
        let pool = Arc::new(
            ConnectionPool::new(connector, Scheme::HTTPS, authority, Duration::from_secs(90), 8)
                .unwrap(),
        );
        let exchange = |i: usize| {
            let pool = pool.clone();
            async move {
                let request = Request::post(format!("/v1/chat/completions?n={i}"))
                    .header(header::HOST, "foldgate.local")
                    .body(crate::http::body::full(format!("body {i}")))
                    .unwrap();
                let response = pool.send(Box::new(request)).await.unwrap();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, format!("body {i}"));
            }
        };
        for i in 0..3 {
            exchange(i).await;
        }
        futures_util::future::join_all((3..8).map(exchange)).await;

        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "one shared connection");
        let seen = lock(&seen);
        assert_eq!(seen.len(), 8);
        for s in seen.iter() {
            assert_eq!(s.version, Version::HTTP_2);
            assert_eq!(s.authority.as_deref(), Some(format!("localhost:{port}").as_str()));
            assert_eq!(s.host, None, "HTTP/2 carries :authority, not Host");
            assert!(s.path.starts_with("/v1/chat/completions?n="), "{}", s.path);
        }
    }

    #[tokio::test]
    async fn an_upstream_that_negotiates_http1_over_tls_keeps_one_connection_for_every_body() {
        use http_body_util::BodyExt;

        let (port, connector, accepted, seen) = tls_upstream(b"http/1.1").await;
        let authority: Authority = format!("localhost:{port}").parse().unwrap();
        let pool = Arc::new(
            ConnectionPool::new(connector, Scheme::HTTPS, authority, Duration::from_secs(90), 8)
                .unwrap(),
        );
        // Whole bodies, one larger than a read, and one streamed in pieces of unknown size.
        let large = "x".repeat(300_000);
        let streamed = || {
            let pieces = ["first ", "second ", "third"]
                .map(|p| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(p))));
            crate::http::body::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
                pieces,
            )))
        };
        let bodies = [
            crate::http::body::full("small"),
            crate::http::body::full(large.clone()),
            streamed(),
            crate::http::body::full(Bytes::new()),
        ];
        let expected = ["small", large.as_str(), "first second third", ""];
        for (body, expected) in bodies.into_iter().zip(expected) {
            let request = Request::post("/v1/echo").body(body).unwrap();
            let response = pool.send(Box::new(request)).await.unwrap();
            assert_eq!(response.status(), http::StatusCode::OK);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, expected);
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "one kept connection");
        let seen = lock(&seen);
        assert!(seen.iter().all(|s| s.version == Version::HTTP_11), "{seen:?}");
        assert!(
            seen.iter().all(|s| s.host.as_ref().is_some_and(|h| h == &format!("localhost:{port}")))
        );
    }
}
