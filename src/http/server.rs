//! The listener: accepts connections, serves them through the tower stack, and
//! drains in-flight requests on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::deadline::Deadlines;
use super::exchange::CompactedRoutes;
use super::inspect::admin::{self, Admin};
use super::layers::{AccessLog, RequestIds};
use super::linger::LINGER_SLACK;
use super::routes::{AppState, Router};
use super::upstream::{Upstream, UpstreamSetupError};
use super::websocket::{Frames, WebSockets};
use super::wire::server::{Settings, serve};
use crate::config::Config;
use crate::config::WebSocketMode;
use crate::metrics::Metrics;

/// The longest wait for a request head (and an idle connection's life), as hyper's
/// `header_read_timeout` was.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr} (server.listen): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The upstream client could not be built.
    #[error(transparent)]
    Upstream(#[from] UpstreamSetupError),
}

/// A bound, not yet running proxy.
pub struct Server {
    listener: TcpListener,
    /// A separate listener for `/metrics` (`metrics.listen`) and its path.
    metrics_listener: Option<(TcpListener, String)>,
    /// The session inspector's listener (`admin.listen`) and what it serves.
    admin_listener: Option<(TcpListener, Arc<Admin>)>,
    state: Arc<AppState>,
    grace: Duration,
    /// The most a lingering close reads: `server.max_body_size` plus some slack.
    max_drain: u64,
    /// Runs the session sweeper (one server per process does).
    housekeeping: bool,
}

/// The sockets a process listens on, bound once and shared by every connection thread.
pub struct Listeners {
    /// `server.listen`.
    pub proxy: std::net::TcpListener,
    /// `metrics.listen`, when metrics have a port of their own.
    pub metrics: Option<std::net::TcpListener>,
    /// `admin.listen`, when the session inspector is on.
    pub admin: Option<std::net::TcpListener>,
}

impl Listeners {
    /// Binds `server.listen` and, if configured, `metrics.listen`.
    pub fn bind(config: &Config) -> Result<Self, ServerError> {
        let bind =
            |addr: SocketAddr| listen(addr).map_err(|source| ServerError::Bind { addr, source });
        let metrics = match (config.metrics.enabled, config.metrics.listen) {
            (true, Some(addr)) => Some(bind(addr)?),
            _ => None,
        };
        let admin = config.admin.listen.map(bind).transpose()?;
        Ok(Self { proxy: bind(config.server.listen)?, metrics, admin })
    }

    /// Another handle on the proxy socket, for one more connection thread.
    pub fn share(&self) -> std::io::Result<Self> {
        Ok(Self { proxy: self.proxy.try_clone()?, metrics: None, admin: None })
    }

    /// Another handle on every socket, for the thread that also serves metrics (and
    /// the session inspector).
    pub fn share_all(&self) -> std::io::Result<Self> {
        let metrics = self.metrics.as_ref().map(std::net::TcpListener::try_clone).transpose()?;
        let admin = self.admin.as_ref().map(std::net::TcpListener::try_clone).transpose()?;
        Ok(Self { proxy: self.proxy.try_clone()?, metrics, admin })
    }
}

/// A non-blocking listening socket on `addr`, as tokio would make it (`SO_REUSEADDR`,
/// a backlog of 1024) but not yet tied to a runtime.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

impl Server {
    /// Binds `config.server.listen` and builds the upstream client; `compacted` serves the
    /// compacted routes.
    pub async fn bind(
        config: &Config,
        compacted: CompactedRoutes,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServerError> {
        Self::on(config, Listeners::bind(config)?, compacted, metrics, true)
    }

    /// A server accepting on `listeners`, with an upstream pool of its own. Must be
    /// called within the tokio runtime that will run it. `housekeeping` runs the
    /// session sweeper.
    pub fn on(
        config: &Config,
        listeners: Listeners,
        compacted: CompactedRoutes,
        metrics: Arc<Metrics>,
        housekeeping: bool,
    ) -> Result<Self, ServerError> {
        let upstream = Upstream::new(&config.upstream)?;
        let anthropic = Upstream::anthropic(&config.upstream)?;
        let addr = config.server.listen;
        let listener = TcpListener::from_std(listeners.proxy)
            .map_err(|source| ServerError::Bind { addr, source })?;
        let websockets = (config.responses.websocket == WebSocketMode::Auto).then(|| {
            let frames = Frames {
                compacted: compacted.clone(),
                upstream: upstream.clone(),
                metrics: metrics.clone(),
                max_body: config.server.max_body_size.0,
            };
            let responses = &config.responses;
            let (max, idle) =
                (responses.websocket_max_connections, responses.websocket_idle_timeout);
            WebSockets::new(frames, max, idle)
        });
        let state = Arc::new(AppState {
            upstream,
            anthropic,
            max_body: config.server.max_body_size.0,
            ready: false.into(),
            compacted,
            metrics,
            metrics_path: (config.metrics.enabled && config.metrics.listen.is_none())
                .then(|| config.metrics.path.clone()),
            websockets,
        });
        let metrics_listener = match listeners.metrics {
            Some(listener) => Some((
                TcpListener::from_std(listener).map_err(|source| ServerError::Bind {
                    addr: config.metrics.listen.unwrap_or(addr),
                    source,
                })?,
                config.metrics.path.clone(),
            )),
            None => None,
        };
        let admin_listener = match (listeners.admin, &state.compacted.inspector) {
            (Some(listener), Some(inspector)) => Some((
                TcpListener::from_std(listener).map_err(|source| ServerError::Bind {
                    addr: config.admin.listen.unwrap_or(addr),
                    source,
                })?,
                Arc::new(Admin::new(inspector.clone(), config.admin.token.expose())),
            )),
            _ => None,
        };
        Ok(Self {
            listener,
            metrics_listener,
            admin_listener,
            state,
            grace: config.server.shutdown_grace,
            max_drain: config.server.max_body_size.0.saturating_add(LINGER_SLACK),
            housekeeping,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The bound address of the separate metrics listener, if configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The bound address of the session inspector's listener, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then stops accepting and lets in-flight
    /// requests finish for up to `server.shutdown_grace`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        // Layer order, outermost first:
        // 0. The HTTP/1.1 connection (`wire::server`): on a response marked `UnreadBody`
        //    by the router (answered before the request body's end) it says
        //    `connection: close` and closes lingering (see `linger`).
        // 1. RequestIds: takes or makes `x-request-id`, sets it on the request, sends it
        //    upstream (as a request header) and back (as a response header).
        // 2. AccessLog: one line per request when the response body ends.
        // 3. Router: local endpoints, or the OpenAI API under /v1/.
        let service = RequestIds::new(AccessLog::new(Router::new(self.state.clone())));
        // The per-request timeouts (request head, upstream first byte) are this thread's
        // coarse deadlines, ticked by `pace_timers`.
        let ticking = Deadlines::install();
        let settings = Settings { head_timeout: HEAD_TIMEOUT, max_drain: self.max_drain };
        let metrics_task = self.metrics_listener.map(|(listener, path)| {
            tokio::spawn(serve_metrics(listener, path, self.state.metrics.clone()))
        });
        let admin_task =
            self.admin_listener.map(|(listener, api)| tokio::spawn(admin::serve(listener, api)));
        let sweeper = self.housekeeping.then(|| tokio::spawn(sweep_sessions(self.state.clone())));
        let pacer = tokio::spawn(pace_timers(self.state.clone(), ticking.deadlines()));
        let stop = CancellationToken::new();
        // Connection tasks live here so that those still open after the grace period
        // are aborted even when the runtime outlives `run` (embedding, tests).
        let mut connections = tokio::task::JoinSet::new();
        self.state.ready.store(true, Ordering::Release);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            // Out of file descriptors and the like: back off, keep serving.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    while connections.try_join_next().is_some() {}
                    connections.spawn(serve(stream, service.clone(), settings, stop.clone()));
                }
                () = &mut shutdown => break,
            }
        }
        self.state.ready.store(false, Ordering::Release);
        drop(self.listener);
        drain(&self.state, self.grace, &stop, &mut connections).await;
        connections.abort_all();
        if let Some(task) = sweeper {
            task.abort();
        }
        pacer.abort();
        drop(ticking);
        if let Some(task) = metrics_task {
            task.abort();
        }
        if let Some(task) = admin_task {
            task.abort();
        }
    }
}

/// Lets in-flight requests finish for up to `grace` (idle connections close at once,
/// busy ones after their response), then the background folds within what is left of
/// it (a digest half made is not thrown away).
async fn drain(
    state: &AppState,
    grace: Duration,
    stop: &CancellationToken,
    connections: &mut tokio::task::JoinSet<()>,
) {
    tracing::info!(grace = %humantime::format_duration(grace), "draining in-flight requests");
    let draining = std::time::Instant::now();
    stop.cancel();
    let closed = async { while connections.join_next().await.is_some() {} };
    match tokio::time::timeout(grace, closed).await {
        Ok(()) => tracing::info!("all connections closed"),
        Err(_) => tracing::warn!(
            open = connections.len(),
            "shutdown grace period over; closing remaining connections"
        ),
    }
    let left = grace.saturating_sub(draining.elapsed());
    state.compacted.conversations.drain(left).await;
}

/// Serves `GET <path>` with the metrics on a listener of its own; 404 otherwise.
async fn serve_metrics(listener: TcpListener, path: String, metrics: Arc<Metrics>) {
    let path: Arc<str> = path.into();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (path, metrics) = (path.clone(), metrics.clone());
        let service =
            hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let response = if request.uri().path() == &*path {
                    super::routes::metrics_response(&metrics)
                } else {
                    super::error::ProxyError::NotFound(request.uri().path().to_owned())
                        .into_response()
                };
                std::future::ready(Ok::<_, std::convert::Infallible>(response))
            });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Ticks the thread's coarse deadlines, keeps a timer due within the next second, and
/// closes upstream connections that have been idle longer than
/// `upstream.pool_idle_timeout`. With this tick pending, a timer armed far ahead never
/// becomes the earliest one, whose arming would interrupt the event loop's wait (an
/// `eventfd` write and one more `epoll_wait` round).
async fn pace_timers(state: Arc<AppState>, deadlines: Arc<Deadlines>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        deadlines.tick();
        state.upstream.close_expired();
        state.anthropic.close_expired();
    }
}

/// Drops expired conversations every minute, refreshes the active-sessions gauge, and
/// reads the context windows other replicas learned (every 5 s, with a shared store).
async fn sweep_sessions(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut ticks: u64 = 0;
    loop {
        tick.tick().await;
        state.compacted.conversations.refresh_windows().await;
        ticks += 1;
        if ticks % 12 != 1 {
            continue;
        }
        let conversations = &state.compacted.conversations;
        let dropped = conversations.sweep();
        // The gauge of conversations held is read when the metrics are scraped.
        if dropped > 0 {
            let active = conversations.active_sessions();
            tracing::debug!(dropped, active, "expired sessions dropped");
        }
    }
}
