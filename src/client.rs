//! The one way foldgate builds an outbound HTTP client: a pooled hyper-util client that
//! speaks HTTP/1.1 and HTTP/2 (ALPN), TLS by rustls with the ring provider, with the
//! upstream's connect timeout, pool settings and trusted roots. Used by the proxy's
//! upstream client and by the LLM summarizer.

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
    let connector = builder.https_or_http().enable_all_versions().wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(upstream.pool_idle_timeout)
        .pool_max_idle_per_host(upstream.pool_max_idle_per_host)
        .build(connector))
}
