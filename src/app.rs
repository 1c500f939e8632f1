//! Composition root: builds the runtime, telemetry and server from the configuration.

use std::process::ExitCode;

use crate::config::Config;
use crate::http::Server;

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
        let server = match Server::bind(&config).await {
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
