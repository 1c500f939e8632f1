//! The one way foldgate makes outbound connections: TCP with the upstream's connect
//! timeout, TLS by rustls with the ring provider and the configured roots, HTTP/1.1 and
//! HTTP/2 by ALPN. The proxy's upstream pool (`http::connections`) uses the connector;
//! the LLM summarizer uses the pooled hyper-util client built on it, and the OTLP trace
//! exporter (`http/protobuf`) opentelemetry-http's hyper client over it.

use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::{TlsRoots, UpstreamConfig};

/// A pooled HTTP(S) client sending bodies of type `B`.
pub type HttpsClient<B> = Client<HttpsConnector<HttpConnector>, B>;

/// The trusted roots could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("upstream.tls_roots: {0}")]
pub struct TlsSetupError(String);

/// Builds a client with `upstream`'s connect timeout, pool settings and TLS roots.
pub fn https_client<B>(upstream: &UpstreamConfig) -> Result<HttpsClient<B>, TlsSetupError>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(upstream.pool_idle_timeout)
        .pool_max_idle_per_host(upstream.pool_max_idle_per_host)
        .build(https_connector(upstream)?))
}

/// The HTTP client of the OTLP trace exporter: the connector of [`https_client`], each
/// export bounded by `timeout`. It needs a tokio runtime to send (the exporter's own).
pub fn otlp_http_client(
    upstream: &UpstreamConfig,
    timeout: Duration,
) -> Result<opentelemetry_http::hyper::HyperClient<HttpsConnector<HttpConnector>>, TlsSetupError> {
    Ok(opentelemetry_http::hyper::HyperClient::new(https_connector(upstream)?, timeout, None))
}

/// The connector behind [`https_client`]: TCP with `upstream`'s connect timeout and
/// `TCP_NODELAY`, then TLS with its roots and ALPN (`h2`, `http/1.1`) for `https` URIs.
pub fn https_connector(
    upstream: &UpstreamConfig,
) -> Result<HttpsConnector<HttpConnector>, TlsSetupError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(upstream.connect_timeout));
    let provider = rustls::crypto::ring::default_provider();
    let builder = match upstream.tls_roots {
        TlsRoots::Webpki => HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)
            .map_err(|e| TlsSetupError(e.to_string()))?,
        TlsRoots::System => HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| TlsSetupError(e.to_string()))?,
    };
    Ok(builder.https_or_http().enable_all_versions().wrap_connector(http))
}
