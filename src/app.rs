//! Composition root: picks the session store and summarizer, builds the engine and the
//! server from the configuration, and runs it.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::compaction::steer::Steer;
use crate::http::session_key::SessionHeaders;

use crate::api::compaction_item::Sealer;
use crate::compaction::{Engine, SessionState};
use crate::config::{Config, ServedBy, StoreKind};
use crate::conversation::{Conversations, Setup, Sharing, Summarizers};
use crate::http::Server;
use crate::http::exchange::CompactedRoutes;
use crate::http::inspect::Inspector;
use crate::http::provider_compaction::CompactionApis;
use crate::http::server::{Listeners, ServerError};
use crate::metrics::{Metrics, Teams};
use crate::session::{
    MemoryStore, Observed, RedisOptions, RedisStore, SessionStore, redis::RedisSetupError,
};
use crate::summarizer::SummarizerKind;
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
    /// The Redis session store could not be set up.
    #[error(transparent)]
    Redis(#[from] RedisSetupError),
    /// `session.header` is not a header name.
    #[error("session.header: {0}")]
    SessionHeader(String),
    /// `compaction.pin` holds a pattern that cannot be used.
    #[error("compaction.pin: {0}")]
    Pin(#[from] crate::compaction::steer::PinError),
    /// A thread or runtime could not be started.
    #[error("cannot start a thread or async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Builds the chat pipeline (engine, store, summarizer) and binds the server, which
/// then runs on the caller's runtime (tests, embedding).
pub async fn build_server(config: &Config) -> Result<Server, AppError> {
    let (compacted, metrics) = build_pipeline(config, None)?;
    Ok(Server::bind(config, compacted, metrics).await?)
}

/// The chat pipeline and the metrics every connection thread shares. Compaction runs on
/// `compaction_runtime` when given.
fn build_pipeline(
    config: &Config,
    compaction_runtime: Option<tokio::runtime::Handle>,
) -> Result<(CompactedRoutes, Arc<Metrics>), AppError> {
    if config.compaction.enabled {
        // The common encoder loads with start-up, not on the first request that counts
        // (cl100k_base, for older models only, when first needed).
        crate::compaction::tokens::encoding::load_default();
    }
    let m = &config.metrics;
    let teams =
        (!m.team_header.is_empty()).then(|| Teams::new(&m.team_header, &m.teams, m.max_teams));
    let metrics = Arc::new(Metrics::new()?.with_teams(teams));
    let store = session_store(config, &metrics)?;
    // Read when the metrics are scraped; a weak handle, as the store reports to them.
    let figures = Arc::downgrade(&store);
    metrics.read_at_scrape(Box::new(move || {
        figures.upgrade().map(|store| (store.active_sessions(), store.failovers_seen()))
    }));
    let summarizers = match config.summarizer.kind {
        SummarizerKind::Extractive => Summarizers::Extractive,
        SummarizerKind::Llm => {
            Summarizers::Llm(LlmSummarizer::new(&config.summarizer, &config.upstream)?)
        }
    };
    let session_header =
        SessionHeaders::new(config.session.header.names()).map_err(AppError::SessionHeader)?;
    let conversations = Conversations::from_setup(Setup {
        engine: Engine::new(config.compaction.clone()),
        store,
        mode: config.compaction.mode,
        sharing: Sharing {
            ttl: config.session.ttl,
            max_sessions: config.session.max_sessions,
            // A summarizer call, then the save of its block.
            lease_ttl: config.summarizer.timeout + Duration::from_secs(10),
            digest_wait: config.summarizer.timeout,
        },
        summarizers,
        metrics: Some(metrics.clone()),
        runtime: compaction_runtime,
    });
    let inspector = config.admin.enabled().then(|| {
        let inspection = conversations.inspection(config.admin.history);
        Arc::new(Inspector::new(inspection, config.admin.tenant_view))
    });
    let steer = Steer::new(&config.summarizer.instructions, &config.compaction.pin)?;
    let compacted = CompactedRoutes {
        conversations,
        session_header,
        steer,
        enabled: config.compaction.enabled,
        inspector,
        compaction_apis: Arc::new(provider_apis(config)),
    };
    Ok((compacted, metrics))
}

/// Who serves the providers' compaction APIs, and the key sealing foldgate's items.
fn provider_apis(config: &Config) -> CompactionApis {
    let sealer = match config.responses.key_bytes() {
        Some(Ok(key)) => Sealer::new(&key),
        // Rejected when the configuration was validated.
        Some(Err(_)) | None => {
            let serves = [config.responses.compact, config.responses.context_management];
            if serves.iter().any(|s| *s != ServedBy::Upstream) {
                tracing::warn!(
                    "responses.compaction_key is not set: a key was generated; compaction items foldgate seals open only in this process (set the same key on every replica)"
                );
            }
            Sealer::generated()
        }
    };
    CompactionApis {
        responses_compact: config.responses.compact,
        responses_context: config.responses.context_management,
        messages_context: config.messages.context_management,
        sealer,
    }
}

/// The configured session store, each operation timed into `metrics`.
fn session_store(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<Arc<dyn SessionStore<SessionState>>, AppError> {
    let session = &config.session;
    let store: Arc<dyn SessionStore<SessionState>> = match session.store {
        StoreKind::Memory => Arc::new(MemoryStore::new(session.ttl, session.max_sessions)),
        StoreKind::Redis => Arc::new(RedisStore::new(&RedisOptions {
            urls: session.redis_url.parts().iter().map(|u| u.expose().to_owned()).collect(),
            mode: session.redis_mode,
            sentinel_master: session.redis_sentinel_master.clone(),
            key_prefix: session.redis_key_prefix.clone(),
            ttl: session.ttl,
            timeout: session.redis_timeout,
            max_sessions: session.max_sessions,
        })?),
    };
    let metrics = metrics.clone();
    Ok(Arc::new(Observed::new(
        store,
        Box::new(move |op, elapsed, failed| metrics.observe_store(op, elapsed, failed)),
    )))
}

/// Transparent huge pages off for the whole process unless `server.transparent_huge_pages`.
/// With them on (the allocator asks for them), the first touch of fresh memory zeroes a
/// 2 MiB page inside the request that touches it: memory a long conversation's request
/// needs, or memory the allocator gave back a second before. On a 480 KiB conversation
/// that made its first requests up to 75 ms slower (docs/PERFORMANCE.md).
fn huge_pages(server: &crate::config::ServerConfig) {
    if server.transparent_huge_pages {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(error = %e, "cannot turn transparent huge pages off");
    }
}

/// Runs the proxy until SIGTERM/SIGINT; exit code 0 after a graceful shutdown.
///
/// Threads are laid out like nginx's workers: `server.workers` connection threads, each
/// with a single-threaded event loop and an upstream pool of its own, accept on one
/// shared listening socket. A request is served start to end on the thread that
/// accepted its connection, with no hand-over between threads. Compaction (token
/// counting, folding, summarizer calls) runs on a separate multi-threaded runtime, so
/// it never stalls the connections of the thread that received the request.
pub fn serve(config: Config) -> ExitCode {
    let _telemetry = crate::telemetry::init(&config);
    match run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            ExitCode::FAILURE
        }
    }
}

fn run(config: &Config) -> Result<(), AppError> {
    huge_pages(&config.server);
    let workers = config.server.worker_threads();
    let compaction = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("foldgate-compaction")
        .enable_all()
        .build()
        .map_err(AppError::Runtime)?;
    let (compacted, metrics) = {
        // The LLM summarizer's client needs a runtime context to be built.
        let _context = compaction.enter();
        build_pipeline(config, Some(compaction.handle().clone()))?
    };
    let listeners = Listeners::bind(config)?;
    let addr = listeners.proxy.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::with_capacity(workers);
    for index in 0..workers {
        let listeners = if index == 0 { listeners.share_all() } else { listeners.share() };
        let listeners = listeners.map_err(AppError::Runtime)?;
        let (config, compacted, metrics) = (config.clone(), compacted.clone(), metrics.clone());
        let (mut stopped, started) = (stopped.clone(), started_tx.clone());
        let thread = std::thread::Builder::new()
            .name(format!("foldgate-conn-{index}"))
            .spawn(move || {
                let runtime =
                    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(runtime) => runtime,
                        Err(e) => return drop(started.send(Err(AppError::Runtime(e)))),
                    };
                runtime.block_on(async move {
                    let server =
                        match Server::on(&config, listeners, compacted, metrics, index == 0) {
                            Ok(server) => server,
                            Err(e) => return drop(started.send(Err(e.into()))),
                        };
                    // Dropping the sender lets `run` see a thread that died before this.
                    let _ = started.send(Ok(()));
                    drop(started);
                    server
                        .run(async move {
                            let _ = stopped.wait_for(|stop| *stop).await;
                        })
                        .await;
                });
            })
            .map_err(AppError::Runtime)?;
        threads.push(thread);
    }
    drop((listeners, started_tx));
    // One message per thread; a thread that panicked while starting sends none.
    let reports: Vec<Result<(), AppError>> = started_rx.iter().collect();
    let reported = reports.len();
    let failed = match reports.into_iter().find(Result::is_err) {
        Some(Err(e)) => Some(e),
        _ if reported < workers => {
            Some(AppError::Runtime(std::io::Error::other("a connection thread died at start")))
        }
        _ => None,
    };
    if let Some(e) = failed {
        let _ = stop.send(true);
        threads.into_iter().for_each(|t| drop(t.join()));
        return Err(e);
    }
    tracing::info!(listen = %addr, upstream = %config.upstream.url, workers, "foldgate listening");
    compaction.block_on(crate::shutdown::signal());
    let _ = stop.send(true);
    for thread in threads {
        if thread.join().is_err() {
            tracing::error!("a connection thread panicked");
        }
    }
    compaction.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}
