//! The router: local endpoints (and each tenant's session inspector under
//! `/foldgate/`), then the OpenAI API under `/v1/`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, Request, Response, StatusCode, header};
use http_body::Body as _;

use super::body::{BodyProgress, ProxyBody, full};
use super::dialect::{ChatCompletions, Dialect, Messages, Responses, ResponsesCompact};
use super::error::ProxyError;
use super::exchange::{self, CompactedRoutes, Place};
use super::linger::UnreadBody;
use super::passthrough;
use super::record::{self, Operation, Record};
use super::trace::{self, in_span};
use super::upstream::Upstream;
use super::websocket::WebSockets;
use super::wire::server::{ClientBody, ClientRequest, ClientService};
use crate::metrics::{Metrics, Route};

/// What every request handler shares.
pub struct AppState {
    /// The provider requests go to (`upstream.url`).
    pub upstream: Upstream,
    /// Where Anthropic Messages requests go (`upstream.anthropic_url`).
    pub anthropic: Upstream,
    /// `server.max_body_size` in bytes.
    pub max_body: u64,
    /// Listener up and not draining.
    pub ready: AtomicBool,
    /// What the compacted routes share (the conversation stage, the inspector).
    pub compacted: CompactedRoutes,
    /// Every metric.
    pub metrics: Arc<Metrics>,
    /// Where `/metrics` is served on the proxy port (`None`: disabled or elsewhere).
    pub metrics_path: Option<String>,
    /// The Responses API's WebSocket mode, when served (`responses.websocket = "auto"`).
    pub websockets: Option<WebSockets>,
}

/// The innermost service: routes a request to its handler.
#[derive(Clone)]
pub struct Router {
    state: Arc<AppState>,
}

impl Router {
    /// A router over `state`.
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state }
    }
}

impl ClientService for Router {
    fn call(
        &mut self,
        request: ClientRequest,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + use<> {
        let state = self.state.clone();
        // Not boxed: the connection's task holds the request's future where it is made.
        async move {
            let has_body = !request.body().is_end_stream();
            let progress = Arc::new(BodyProgress::default());
            let (route, result) = dispatch(&state, request, &progress).await;
            let mut response = result.unwrap_or_else(ProxyError::into_response);
            record::answered(&state.metrics, route, response.status().as_u16());
            // An answer before the body's end (ours, or an upstream's that did not wait
            // for it): the connection must close, and lingering (see `linger`).
            if has_body && !progress.ended() {
                response.extensions_mut().insert(UnreadBody);
            }
            response
        }
    }
}

/// A request of a compacted API shape, through its exchange with its `dialect`.
async fn compacted<D: Dialect>(
    state: &AppState,
    dialect: &D,
    upstream: &Upstream,
    request: ClientRequest,
    progress: &Arc<BodyProgress>,
) -> (Route, Result<Response<ProxyBody>, ProxyError>) {
    if let Err(error) = within_limit(state, &request) {
        return (dialect.route(), Err(error));
    }
    let span =
        trace::request_span(dialect.route(), exchange::answers_whole(dialect), request.headers());
    let place = Place {
        routes: &state.compacted,
        dialect,
        upstream,
        metrics: &state.metrics,
        max_body: state.max_body,
        socket: None,
    };
    let response = in_span!(&span, exchange::run(place, request, progress.clone()));
    (dialect.route(), traced(&span, response))
}

/// `response`, its status recorded on the request's `span`.
fn traced(
    span: &tracing::Span,
    response: Result<Response<ProxyBody>, ProxyError>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if !span.is_disabled() {
        let status = response.as_ref().map_or_else(ProxyError::status, Response::status);
        trace::record_status(span, status);
    }
    response
}

/// A request forwarded as it is to `upstream`, in a span of its own.
async fn forwarded(
    state: &AppState,
    upstream: &Upstream,
    request: ClientRequest,
    progress: &Arc<BodyProgress>,
) -> (Route, Result<Response<ProxyBody>, ProxyError>) {
    if let Err(error) = within_limit(state, &request) {
        return (Route::Passthrough, Err(error));
    }
    let span = trace::passthrough_span(request.method(), request.headers());
    let record = Record::new(Route::Passthrough, Operation::Forward, std::time::Instant::now());
    let (max_body, metrics) = (state.max_body, &state.metrics);
    let forward =
        passthrough::forward(upstream, max_body, metrics, request, progress.clone(), record);
    let response = in_span!(&span, forward);
    (Route::Passthrough, traced(&span, response))
}

/// Routes `request`; handlers that read its body record how far in `progress`.
async fn dispatch(
    state: &AppState,
    request: ClientRequest,
    progress: &Arc<BodyProgress>,
) -> (Route, Result<Response<ProxyBody>, ProxyError>) {
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::GET, "/healthz") => {
            (Route::Local, Ok(json(StatusCode::OK, r#"{"status":"ok"}"#)))
        }
        (&Method::GET, "/readyz") => (
            Route::Local,
            Ok(if state.ready.load(Ordering::Acquire) {
                json(StatusCode::OK, r#"{"status":"ready"}"#)
            } else {
                json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"not ready"}"#)
            }),
        ),
        (&Method::GET, p) if state.metrics_path.as_deref() == Some(p) => {
            (Route::Local, Ok(metrics_response(&state.metrics)))
        }
        (&Method::POST, "/v1/chat/completions") => {
            compacted(state, &ChatCompletions, &state.upstream, request, progress).await
        }
        (&Method::POST, "/v1/responses") => {
            compacted(state, &Responses, &state.upstream, request, progress).await
        }
        // The Responses API's WebSocket mode (Codex tries it first): served here, or
        // (`responses.websocket = "off"`) answered at once with 426, which clients read
        // as "use HTTP", instead of a relayed 200 they retry before falling back.
        (&Method::GET, "/v1/responses") if is_websocket_upgrade(request.headers()) => {
            let answer = match &state.websockets {
                Some(sockets) => super::websocket::upgrade(sockets, request),
                None => Err(ProxyError::UpgradeRequired("the Responses API")),
            };
            (Route::Responses, answer)
        }
        (&Method::POST, "/v1/responses/compact") => {
            compacted(state, &ResponsesCompact, &state.upstream, request, progress).await
        }
        (&Method::POST, "/v1/messages") => {
            compacted(state, &Messages, &state.anthropic, request, progress).await
        }
        // Anthropic's API beside OpenAI's: one foldgate serves both kinds of client.
        (_, p) if is_anthropic(p) => forwarded(state, &state.anthropic, request, progress).await,
        (_, p) if p == "/v1" || p.starts_with("/v1/") => {
            forwarded(state, &state.upstream, request, progress).await
        }
        (_, p) if p.starts_with("/foldgate/") => {
            let inspector = state.compacted.inspector.as_deref();
            let (method, headers) = (request.method(), request.headers());
            (Route::Local, super::inspect::tenant::handle(inspector, method, p, headers).await)
        }
        _ => (Route::Unknown, Err(ProxyError::NotFound(path.to_owned()))),
    }
}

/// The body limit, checked once for every route that reads a body (compacted and
/// forwarded): a declared length past it is refused before a byte is read; a body that
/// grows past it is cut where it is read.
fn within_limit(state: &AppState, request: &Request<ClientBody>) -> Result<(), ProxyError> {
    // The length its `Content-Length` declared, as the connection read it (no lookup).
    match request.body().size_hint().exact() {
        Some(len) if len > state.max_body => {
            Err(ProxyError::BodyTooLarge { limit: state.max_body })
        }
        _ => Ok(()),
    }
}

/// True when `headers` ask to upgrade the connection to a WebSocket.
fn is_websocket_upgrade(headers: &header::HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("websocket"))
}

/// True for the paths of Anthropic's Messages API (`/v1/messages`,
/// `/v1/messages/count_tokens`, `/v1/messages/batches...`), which go to
/// `upstream.anthropic_url`.
pub fn is_anthropic(path: &str) -> bool {
    path.strip_prefix("/v1/messages").is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The Prometheus text exposition.
pub fn metrics_response(metrics: &Metrics) -> Response<ProxyBody> {
    let mut response = Response::new(full(metrics.render()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

fn json(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::{is_anthropic, is_websocket_upgrade};

    #[test]
    fn messages_paths_go_to_anthropic() {
        for path in ["/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches/b1"] {
            assert!(is_anthropic(path), "{path}");
        }
        for path in ["/v1/messagesx", "/v1/chat/completions", "/v1/models", "/messages"] {
            assert!(!is_anthropic(path), "{path}");
        }
    }

    #[test]
    fn websocket_upgrades_are_recognised() {
        let with = |value: &'static str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::UPGRADE, http::HeaderValue::from_static(value));
            headers
        };
        assert!(is_websocket_upgrade(&with("websocket")));
        assert!(is_websocket_upgrade(&with("WebSocket")));
        assert!(is_websocket_upgrade(&with("h2c, websocket")));
        assert!(!is_websocket_upgrade(&with("h2c")));
        assert!(!is_websocket_upgrade(&http::HeaderMap::new()));
    }
}
