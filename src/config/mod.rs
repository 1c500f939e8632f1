//! Configuration: plain serde data, the environment overlay, and validation.
//!
//! Sources, lowest precedence first: the embedded defaults (the same values as
//! `config/foldgate.toml`), the standard `OTEL_*` variables for `[telemetry]` (see
//! `telemetry.rs`), an optional TOML file, then environment variables
//! `FOLDGATE_<SECTION>__<KEY>` plus the short forms `FOLDGATE_LISTEN` and
//! `FOLDGATE_UPSTREAM_URL`. Every error names the key and where its value came from.
//! This module imports nothing else of the crate.

mod admin;
mod bytesize;
mod compaction;
mod compaction_apis;
mod env;
pub mod pins;
mod secret;
mod session;
mod telemetry;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::vocab::SummarizerKind;
pub use admin::AdminConfig;
pub use bytesize::ByteSize;
pub use compaction::{CompactionConfig, CompactionMode, ModelEntry};
pub use compaction_apis::{
    COMPACTION_KEY_LEN, MessagesConfig, ResponsesConfig, ServedBy, WebSocketMode,
};
pub use secret::{Secret, SecretUrl};
pub use session::{HeaderNames, RedisMode, SessionConfig, StoreKind, SummarizerConfig};
pub use telemetry::{DEFAULT_SERVICE_NAME, OtlpProtocol, TelemetryConfig};

/// The shipped configuration file, every option with its default.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../../config/foldgate.toml");

/// The whole effective configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listener and request handling.
    pub server: ServerConfig,
    /// The provider requests are forwarded to.
    pub upstream: UpstreamConfig,
    /// Logging.
    pub log: LogConfig,
    /// The compaction engine.
    pub compaction: CompactionConfig,
    /// Conversation state.
    pub session: SessionConfig,
    /// Digest writing.
    pub summarizer: SummarizerConfig,
    /// Prometheus metrics endpoint.
    pub metrics: MetricsConfig,
    /// The session inspector.
    pub admin: AdminConfig,
    /// OpenAI's Responses compaction, for upstreams without it.
    pub responses: ResponsesConfig,
    /// Anthropic's context management, for upstreams without it.
    pub messages: MessagesConfig,
    /// OpenTelemetry trace export.
    pub telemetry: TelemetryConfig,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve metrics at all.
    pub enabled: bool,
    /// Path of the endpoint.
    pub path: String,
    /// A separate listen address for metrics; unset: served on the proxy's port.
    pub listen: Option<SocketAddr>,
    /// A request header naming the caller's team (e.g. `x-team`): token usage is then
    /// also counted by team (`foldgate_team_tokens_total`). Empty: not counted by team.
    pub team_header: String,
    /// The teams counted by name; any other value counts as `other`. Empty: the first
    /// `max_teams` values seen are counted by name.
    pub teams: Vec<String>,
    /// With no `teams` list, at most this many teams are counted by name.
    pub max_teams: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: "/metrics".to_owned(),
            listen: None,
            team_header: String::new(),
            teams: Vec::new(),
            max_teams: 50,
        }
    }
}

/// `[server]`: the listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the proxy listens on.
    pub listen: SocketAddr,
    /// Largest request body accepted; larger bodies get a 413.
    pub max_body_size: ByteSize,
    /// How long in-flight requests may run after SIGTERM/SIGINT before exit.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Threads serving connections, each with its own event loop and upstream pool;
    /// 0 means one per CPU core.
    pub workers: usize,
    /// Let the kernel back foldgate's memory with transparent huge pages (Linux). Off by
    /// default: the first touch of a huge page zeroes 2 MiB inside whichever request
    /// touches it, which made the first requests of a long conversation tens of
    /// milliseconds slower.
    pub transparent_huge_pages: bool,
}

impl ServerConfig {
    /// The number of connection-serving threads: `workers`, or one per core when 0.
    pub fn worker_threads(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_size: ByteSize(32 * 1024 * 1024),
            shutdown_grace: Duration::from_secs(30),
            workers: 0,
            transparent_huge_pages: false,
        }
    }
}

/// `[upstream]`: where requests go and how the client behaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// OpenAI base URL, as a client would put in `OPENAI_BASE_URL`.
    pub url: String,
    /// Anthropic base URL, as a client would put in `ANTHROPIC_BASE_URL`: foldgate's
    /// `/v1/messages` (and `/v1/messages/...`) goes to `<anthropic_url>/v1/messages`.
    pub anthropic_url: String,
    /// Time allowed to establish a TCP (and TLS) connection.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time allowed from sending the request to receiving response headers.
    #[serde(with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// How long an idle pooled connection is kept.
    #[serde(with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    /// Maximum idle HTTP/1.1 connections kept, per connection thread.
    pub pool_max_idle_per_host: usize,
    /// Trusted roots for TLS: `webpki` (bundled Mozilla roots) or `system`.
    pub tls_roots: TlsRoots,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            url: "https://api.openai.com/v1".to_owned(),
            anthropic_url: "https://api.anthropic.com".to_owned(),
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(600),
            pool_idle_timeout: Duration::from_secs(90),
            pool_max_idle_per_host: 64,
            tls_roots: TlsRoots::Webpki,
        }
    }
}

/// Which certificate roots the upstream client trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsRoots {
    /// The Mozilla root set compiled into the binary.
    Webpki,
    /// The operating system's certificate store.
    System,
}

/// `[log]`: the tracing subscriber.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter directive, e.g. `info` or `foldgate=debug,info`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, level: "info".to_owned() }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A configuration that could not be loaded, naming the key and its origin.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{origin}: invalid TOML: {message}")]
    Syntax {
        /// File name or "embedded defaults".
        origin: String,
        /// Parser message with line and column.
        message: String,
    },
    /// A key is unknown or its value is invalid.
    #[error("{origin}: key `{key}`: {message}")]
    Invalid {
        /// Where the value came from (file, or environment variable).
        origin: String,
        /// Dotted key, e.g. `server.listen`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// Where the configuration is read from.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// TOML file; `None` runs the embedded defaults.
    pub file: Option<PathBuf>,
    /// Environment variables to overlay (all of them; non-`FOLDGATE_` ones are ignored).
    pub env: Vec<(String, String)>,
}

impl ConfigSource {
    /// The file given on the command line and the process environment.
    pub fn from_process(file: Option<PathBuf>) -> Self {
        Self { file, env: std::env::vars().collect() }
    }
}

impl Config {
    /// Loads, overlays and validates the configuration.
    pub fn load(source: &ConfigSource) -> Result<Self, ConfigError> {
        let (text, origin) = match &source.file {
            Some(path) => (
                std::fs::read_to_string(path)
                    .map_err(|e| ConfigError::Read { path: path.clone(), source: e })?,
                path.display().to_string(),
            ),
            None => (String::new(), "embedded defaults".to_owned()),
        };
        Self::from_toml_str(&text, &origin, &source.env)
    }

    /// Parses `text` (origin names it in errors), overlays `env`, and validates.
    pub fn from_toml_str(
        text: &str,
        origin: &str,
        env: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            ConfigError::Syntax { origin: origin.to_owned(), message: e.to_string() }
        })?;
        let mut overrides = env::apply(&mut table, env)?;
        let origin_of = |overrides: &[env::Override], key: &str| -> String {
            overrides
                .iter()
                .find(|o| o.covers(key))
                .map(|o| format!("environment variable {}", o.var))
                .unwrap_or_else(|| origin.to_owned())
        };
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                let key = e.path().to_string();
                ConfigError::Invalid {
                    origin: origin_of(&overrides, &key),
                    message: e.into_inner().to_string(),
                    key,
                }
            })?;
        let adopted = config.telemetry.adopt_standard_env(env).map_err(|(var, message)| {
            ConfigError::Invalid {
                origin: format!("environment variable {}", var.var),
                key: var.key,
                message,
            }
        })?;
        overrides.extend(adopted);
        config.validate().map_err(|(key, message)| ConfigError::Invalid {
            origin: origin_of(&overrides, key),
            key: key.to_owned(),
            message,
        })?;
        Ok(config)
    }

    /// Checks values serde cannot: URL shape, ratios, limits.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        crate::config::validate_upstream_url(&self.upstream.url)
            .map_err(|m| ("upstream.url", m))?;
        crate::config::validate_upstream_url(&self.upstream.anthropic_url)
            .map_err(|m| ("upstream.anthropic_url", m))?;
        if self.server.max_body_size.0 == 0 {
            return Err(("server.max_body_size", "must be greater than 0".to_owned()));
        }
        if self.upstream.connect_timeout.is_zero() {
            return Err(("upstream.connect_timeout", "must be greater than 0".to_owned()));
        }
        if self.upstream.first_byte_timeout.is_zero() {
            return Err(("upstream.first_byte_timeout", "must be greater than 0".to_owned()));
        }
        if let Err(e) = tracing_filter_is_valid(&self.log.level) {
            return Err(("log.level", e));
        }
        let header = &self.metrics.team_header;
        if !header.is_empty() && !session::header_name_is_valid(header) {
            return Err(("metrics.team_header", format!("`{header}` is not a valid header name")));
        }
        if !self.metrics.path.starts_with('/') || self.metrics.path.starts_with("/v1/") {
            return Err((
                "metrics.path",
                format!("`{}` must start with / and not be under /v1/", self.metrics.path),
            ));
        }
        self.session.validate()?;
        self.summarizer.validate()?;
        self.admin.validate()?;
        self.responses.validate()?;
        self.telemetry.validate()?;
        self.compaction.validate()
    }

    /// The effective configuration as TOML, secrets masked.
    pub fn to_toml_masked(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// Checks that `url` is an absolute http(s) URL with a host and no query or fragment.
pub fn validate_upstream_url(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("`{url}` is not a valid URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("`{url}` must use http or https"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{url}` has no host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("`{url}` must not have a query or fragment"));
    }
    Ok(())
}

fn tracing_filter_is_valid(level: &str) -> Result<(), String> {
    // Accept the same grammar as the subscriber without depending on it here:
    // comma-separated `target=level` or `level` directives.
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    for directive in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let lvl = directive.rsplit('=').next().unwrap_or(directive);
        if !LEVELS.contains(&lvl.to_ascii_lowercase().as_str()) {
            return Err(format!("`{directive}` is not a level (one of {})", LEVELS.join(", ")));
        }
    }
    Ok(())
}

/// Resolves the config file path: the `--config` argument, else `FOLDGATE_CONFIG`.
pub fn resolve_file(arg: Option<&Path>, env: &[(String, String)]) -> Option<PathBuf> {
    arg.map(Path::to_path_buf).or_else(|| {
        env.iter().find(|(k, v)| k == "FOLDGATE_CONFIG" && !v.is_empty()).map(|(_, v)| v.into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn shipped_file_equals_builtin_defaults() {
        let parsed = Config::from_toml_str(DEFAULT_CONFIG_TOML, "config/foldgate.toml", &[])
            .expect("shipped config parses");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn empty_source_runs_defaults() {
        let c = Config::from_toml_str("", "x", &[]).unwrap();
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.upstream.url, "https://api.openai.com/v1");
    }

    #[test]
    fn env_overrides_nested_and_short_forms() {
        let c = Config::from_toml_str(
            "[server]\nlisten = \"127.0.0.1:1\"\n",
            "f.toml",
            &env(&[
                ("FOLDGATE_LISTEN", "0.0.0.0:9000"),
                ("FOLDGATE_UPSTREAM_URL", "http://localhost:11434/v1"),
                ("FOLDGATE_UPSTREAM__CONNECT_TIMEOUT", "3s"),
                ("FOLDGATE_SERVER__MAX_BODY_SIZE", "1MiB"),
                ("FOLDGATE_COMPACTION__TRIGGER_RATIO", "0.8"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(c.server.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(c.upstream.url, "http://localhost:11434/v1");
        assert_eq!(c.upstream.connect_timeout, Duration::from_secs(3));
        assert_eq!(c.server.max_body_size.0, 1024 * 1024);
        assert!((c.compaction.trigger_ratio - 0.8).abs() < 1e-9);
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let err = Config::from_toml_str("[server]\nlisen = \"x\"\n", "my.toml", &[]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("my.toml"), "{msg}");
        assert!(msg.contains("lisen"), "{msg}");
    }

    #[test]
    fn bad_url_names_key() {
        let err =
            Config::from_toml_str("[upstream]\nurl = \"ftp://x\"\n", "my.toml", &[]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("upstream.url") && msg.contains("my.toml"), "{msg}");
    }

    #[test]
    fn anthropic_url_comes_from_the_environment_and_is_validated() {
        assert_eq!(Config::default().upstream.anthropic_url, "https://api.anthropic.com");
        let c = Config::from_toml_str(
            "",
            "f",
            &env(&[("FOLDGATE_UPSTREAM__ANTHROPIC_URL", "http://127.0.0.1:9/anthropic")]),
        )
        .unwrap();
        assert_eq!(c.upstream.anthropic_url, "http://127.0.0.1:9/anthropic");
        let err =
            Config::from_toml_str("[upstream]\nanthropic_url = \"api.anthropic.com\"\n", "f", &[])
                .unwrap_err();
        assert!(err.to_string().contains("upstream.anthropic_url"), "{err}");
    }

    #[test]
    fn bad_env_value_names_variable() {
        let err = Config::from_toml_str("", "f", &env(&[("FOLDGATE_LISTEN", "not-an-addr")]))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("FOLDGATE_LISTEN") && msg.contains("server.listen"), "{msg}");
    }

    #[test]
    fn unknown_env_section_is_an_error() {
        let err =
            Config::from_toml_str("", "f", &env(&[("FOLDGATE_SERVR__LISTEN", "x")])).unwrap_err();
        assert!(err.to_string().contains("FOLDGATE_SERVR__LISTEN"), "{err}");
    }

    #[test]
    fn ratio_out_of_range_is_rejected() {
        let err = Config::from_toml_str("[compaction]\ntrigger_ratio = 1.5\n", "f.toml", &[])
            .unwrap_err();
        assert!(err.to_string().contains("compaction.trigger_ratio"), "{err}");
    }

    #[test]
    fn bad_log_level_is_rejected() {
        let err = Config::from_toml_str("[log]\nlevel = \"loud\"\n", "f.toml", &[]).unwrap_err();
        assert!(err.to_string().contains("log.level"), "{err}");
    }
}
