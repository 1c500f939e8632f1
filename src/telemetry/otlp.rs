//! The OTLP exporter of `[telemetry]`: finished spans batched by the SDK's batch processor
//! (a thread of its own), sent over gRPC (tonic, TLS with the roots of
//! `upstream.tls_roots`) or HTTP/protobuf (hyper over foldgate's own connector,
//! `crate::client`) from a tokio runtime of its own (one thread, `foldgate-otlp`):
//! exporting never takes time from a connection thread or the compaction runtime. What is
//! queued is exported when the [`Pipeline`] is dropped at shutdown.
//!
//! The processor is the SDK's thread-based one: a span that ends is put in a queue, and
//! its thread is woken only when a batch is full or the schedule delay has passed, as the
//! log's writer thread is. The processor that runs as a task on an async runtime wakes
//! that task for every span that ends, a cross-thread wake-up per span: 2,400 to 4,600
//! more instructions per request by callgrind, before the kernel's share of each wake-up
//! (`docs/PERFORMANCE.md`, "Trace export"). The processor's thread cannot drive tonic or
//! hyper, so each export is handed to the runtime ([`OnRuntime`]).
//!
//! The exporter and the SDK read the other standard variables themselves:
//! `OTEL_EXPORTER_OTLP_HEADERS` (`_TRACES_HEADERS`), `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_RESOURCE_ATTRIBUTES`, and the batch processor's `OTEL_BSP_*` (schedule delay,
//! queue and batch sizes). Compression is not built in: the exporter ignores
//! `OTEL_EXPORTER_OTLP_COMPRESSION` and sends spans uncompressed.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
use opentelemetry_otlp::{
    Protocol, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter as ExportSpans, Tracer,
};

use crate::config::{OtlpProtocol, TelemetryConfig, TlsRoots, UpstreamConfig};

/// The longest shutdown waits for the last spans to be exported.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// The time allowed for one export over HTTP (gRPC: `OTEL_EXPORTER_OTLP_TIMEOUT`).
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the exporter could not be set up (foldgate then runs without it).
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// Its runtime could not start.
    #[error("cannot start the exporter's runtime: {0}")]
    Runtime(std::io::Error),
    /// The TLS roots could not be loaded.
    #[error(transparent)]
    Tls(#[from] crate::client::TlsSetupError),
    /// The exporter rejected its configuration.
    #[error(transparent)]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The running exporter: its tracer provider and runtime. Dropping it exports what is
/// still queued, waiting at most [`SHUTDOWN_WAIT`].
pub struct Pipeline {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Pipeline {
    /// Starts the exporter `config` describes.
    pub fn start(config: &TelemetryConfig, upstream: &UpstreamConfig) -> Result<Self, OtlpError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("foldgate-otlp")
            .enable_all()
            .build()
            .map_err(OtlpError::Runtime)?;
        // tonic's channel starts its connection task on this runtime.
        let _context = runtime.enter();
        let exporter = OnRuntime {
            inner: Arc::new(exporter(config, upstream)?),
            runtime: runtime.handle().clone(),
        };
        let processor = BatchSpanProcessor::builder(exporter).build();
        let resource = Resource::builder()
            .with_service_name(config.service().to_owned())
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        let ratio = Sampler::TraceIdRatioBased(config.sampling_ratio);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(ratio)))
            .with_resource(resource)
            .build();
        drop(_context);
        Ok(Self { provider, runtime: Some(runtime) })
    }

    /// The tracer foldgate's spans are made with.
    pub fn tracer(&self) -> Tracer {
        self.provider.tracer("foldgate")
    }
}

/// The span exporter of `config`'s protocol, sending to its endpoint.
fn exporter(
    config: &TelemetryConfig,
    upstream: &UpstreamConfig,
) -> Result<SpanExporter, OtlpError> {
    let url = config.export_url();
    Ok(match config.protocol() {
        OtlpProtocol::Grpc => {
            let builder = SpanExporter::builder().with_tonic().with_endpoint(url.clone());
            if url.starts_with("https:") {
                let tls = match upstream.tls_roots {
                    TlsRoots::Webpki => ClientTlsConfig::new().with_webpki_roots(),
                    TlsRoots::System => ClientTlsConfig::new().with_native_roots(),
                };
                builder.with_tls_config(tls).build()?
            } else {
                builder.build()?
            }
        }
        OtlpProtocol::HttpProtobuf => SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_http_client(crate::client::otlp_http_client(upstream, HTTP_TIMEOUT)?)
            .build()?,
    })
}

/// An exporter whose exports run on the pipeline's runtime, awaited from the batch
/// processor's thread.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<SpanExporter>,
    runtime: tokio::runtime::Handle,
}

impl ExportSpans for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = self.inner.clone();
        match self.runtime.spawn(async move { inner.export(batch).await }).await {
            Ok(result) => result,
            Err(e) => Err(OTelSdkError::InternalFailure(format!("export task ended: {e}"))),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        // Set once, as the provider is built, before any export shares the exporter.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // The provider's shutdown blocks until the processor's task has exported what
        // was queued: on a thread of its own, so that a collector that does not answer
        // holds the exit up for at most SHUTDOWN_WAIT.
        let provider = self.provider.clone();
        let (done, flushed) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("foldgate-otlp-flush".to_owned())
            .spawn(move || drop(done.send(provider.shutdown())));
        let result = match spawned {
            Ok(_) => flushed.recv_timeout(SHUTDOWN_WAIT).ok(),
            Err(_) => Some(self.provider.shutdown()),
        };
        match result {
            Some(Ok(())) => {}
            Some(Err(error)) => tracing::warn!(%error, "spans not exported at shutdown"),
            None => tracing::warn!(
                wait_s = SHUTDOWN_WAIT.as_secs(),
                "spans still queued at shutdown were dropped: the collector did not answer"
            ),
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_millis(500));
        }
    }
}
