//! Logs and traces: the tracing subscriber, which writes text or JSON lines to stderr from
//! a thread of its own (`log_writer`), and, when `[telemetry]` names an OTLP endpoint,
//! exports foldgate's spans (`otlp`; the spans and what they record: `span`; the W3C
//! trace context they continue and forward: `context`).
//!
//! Export off (the default), the subscriber is the log alone, as if tracing did not
//! exist: foldgate's spans are made at a target its filter turns off, so none is ever
//! created. Export on, the log layer and the OpenTelemetry layer each have a filter of
//! their own: the log sees what `log.level` lets through and never foldgate's spans (its
//! lines are unchanged); the OpenTelemetry layer sees foldgate's spans only.

pub mod access;
pub mod context;
mod log_writer;
mod otlp;
pub mod span;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

pub use log_writer::{FLUSH_EVERY, LogGuard, MAX_BACKLOG, QueueWriter, WAKE_AT, spawn};
pub use otlp::{OtlpError, Pipeline, SHUTDOWN_WAIT};

use crate::config::{Config, LogConfig, LogFormat};

/// What [`init`] started. Keep it until exit: dropping it exports the spans still queued
/// (bounded, see [`SHUTDOWN_WAIT`]), then writes out the log lines still queued.
pub struct Telemetry {
    // Dropped in this order: the exporter's last warnings still reach the log.
    pipeline: Option<Pipeline>,
    _log: LogGuard,
}

impl Telemetry {
    /// True when spans are exported.
    pub fn exporting(&self) -> bool {
        self.pipeline.is_some()
    }
}

/// Installs the global subscriber (`RUST_LOG` overrides `log.level` when set) and, when
/// `telemetry` names an endpoint, the span exporter. An exporter that cannot start is
/// logged, and foldgate runs without it. A second call (tests) keeps the first
/// subscriber.
pub fn init(config: &Config) -> Telemetry {
    let (writer, log) = spawn(std::io::stderr());
    let filter = log_filter(&config.log);
    let format = config.log.format;
    if !config.telemetry.enabled() {
        install_log(filter, writer, format);
        return Telemetry { pipeline: None, _log: log };
    }
    match Pipeline::start(&config.telemetry, &config.upstream) {
        Ok(pipeline) => {
            install_with_export(filter, writer, format, &pipeline);
            tracing::info!(
                endpoint = %config.telemetry.otlp_endpoint,
                protocol = config.telemetry.protocol().as_str(),
                service = config.telemetry.service(),
                "exporting traces over OTLP"
            );
            Telemetry { pipeline: Some(pipeline), _log: log }
        }
        Err(error) => {
            install_log(filter, writer, format);
            tracing::error!(%error, "trace export could not start; running without it");
            Telemetry { pipeline: None, _log: log }
        }
    }
}

/// The log's filter: `RUST_LOG`, else `log.level`; foldgate's spans always off.
fn log_filter(log: &LogConfig) -> EnvFilter {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    match format!("{}=off", span::TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// The log alone, `filter` applying to everything.
fn install_log(filter: EnvFilter, writer: QueueWriter, format: LogFormat) {
    let access = writer.clone();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    let installed = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if installed.is_ok() {
        access::install(access, format);
    }
}

/// The log (behind `filter`) beside the OpenTelemetry layer of `pipeline` (behind a
/// filter of foldgate's spans).
fn install_with_export(
    filter: EnvFilter,
    writer: QueueWriter,
    format: LogFormat,
    pipeline: &Pipeline,
) {
    let access = writer.clone();
    let log: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => {
            tracing_subscriber::fmt::layer().with_ansi(false).with_writer(writer).boxed()
        }
        LogFormat::Json => {
            tracing_subscriber::fmt::layer().json().flatten_event(true).with_writer(writer).boxed()
        }
    };
    let spans = Targets::new().with_target(span::TARGET, tracing::Level::TRACE);
    let otel = tracing_opentelemetry::layer()
        .with_tracer(pipeline.tracer())
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(spans);
    let installed =
        tracing_subscriber::registry().with(log.with_filter(filter)).with(otel).try_init();
    if installed.is_ok() {
        access::install(access, format);
    }
}
