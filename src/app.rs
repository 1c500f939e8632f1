//! Composition root: picks the session store and summarizer, builds the engine and the
//! server from the configuration, and runs it.

use std::process::ExitCode;
use std::sync::Arc;

use http::HeaderName;

use crate::compaction::{Engine, SessionState};
use crate::compactor::Compactor;
use crate::config::{Config, SummarizerKind};
use crate::http::Server;
use crate::http::chat::{ChatState, Summarizers};
use crate::http::server::ServerError;
use crate::metrics::Metrics;
use crate::session::{MemoryStore, SessionStore};
use crate::summarizer::llm::LlmSummarizer;

/// Why the proxy could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The server could not start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// Metrics could not be registered.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// The LLM summarizer could not be built.
    #[error(transparent)]
    Summarizer(#[from] crate::summarizer::llm::LlmSetupError),
    /// `session.header` is not a header name.
    #[error("session.header: {0}")]
    SessionHeader(String),
}

/// Builds the chat pipeline (engine, store, summarizer) and binds the server.
pub async fn build_server(config: &Config) -> Result<Server, AppError> {
    let store: Arc<dyn SessionStore<SessionState>> =
        Arc::new(MemoryStore::new(config.session.ttl, config.session.max_sessions));
    let summarizers = match config.summarizer.kind {
        SummarizerKind::Extractive => Summarizers::Extractive,
        SummarizerKind::Llm => {
            Summarizers::Llm(LlmSummarizer::new(&config.summarizer, &config.upstream)?)
        }
    };
    let session_header = HeaderName::from_bytes(config.session.header.as_bytes())
        .map_err(|e| AppError::SessionHeader(e.to_string()))?;
    let chat = ChatState {
        compactor: Compactor::new(
            Engine::new(config.compaction.clone()),
            store,
            config.compaction.mode,
        ),
        summarizers,
        session_header,
        enabled: config.compaction.enabled,
    };
    let metrics = Arc::new(Metrics::new()?);
    Ok(Server::bind(config, chat, metrics).await?)
}

/// Runs the proxy until SIGTERM/SIGINT; exit code 0 after a graceful shutdown.
pub fn serve(config: Config) -> ExitCode {
    crate::telemetry::init(&config.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let server = match build_server(&config).await {
            Ok(server) => server,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        let addr = server.local_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(listen = %addr, upstream = %config.upstream.url, "foldgate listening");
        server.run(crate::shutdown::signal()).await;
        ExitCode::SUCCESS
    })
}
