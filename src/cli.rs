//! Command-line arguments (clap), nothing else.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// foldgate: a reverse proxy for OpenAI-compatible APIs that compacts long conversations.
#[derive(Debug, Parser)]
#[command(name = "foldgate", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy.
    Serve(ConfigArgs),
    /// Validate the configuration and print it with secrets masked.
    CheckConfig(ConfigArgs),
    /// Compact one request body (dry run; chat completions unless `--api` says otherwise): forwarded body on stdout, report on stderr.
    Compact(CompactArgs),
    /// Replay recorded conversations (JSON Lines) through the engine and report the results.
    Replay(ReplayArgs),
}

/// The API shape of a request body (`--api`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiShape {
    /// Chat completions.
    Chat,
    /// The Responses API.
    Responses,
    /// Anthropic Messages.
    Messages,
}

/// Where the configuration comes from.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// TOML configuration file (default: embedded defaults; also `FOLDGATE_CONFIG`).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Arguments of `foldgate compact`.
#[derive(Debug, Args)]
pub struct CompactArgs {
    /// Configuration (the `[compaction]` section is used).
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Model to assume (default: the request's `model`).
    #[arg(long)]
    pub model: Option<String>,
    /// Cap the context window at N tokens, like `compaction.max_context_tokens`.
    #[arg(long, value_name = "N")]
    pub window: Option<usize>,
    /// Write the report to stderr as JSON.
    #[arg(long)]
    pub report_json: bool,
    /// The API shape of the body.
    #[arg(long, value_enum, default_value_t = ApiShape::Chat)]
    pub api: ApiShape,
    /// Request body file; `-` or nothing reads stdin.
    #[arg(value_name = "FILE|-")]
    pub input: Option<PathBuf>,
}

/// Arguments of `foldgate replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Configuration (the `[compaction]` section is used).
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Model to assume for every conversation (default: each record's `model`).
    #[arg(long)]
    pub model: Option<String>,
    /// Cap the context window at N tokens, like `compaction.max_context_tokens`.
    #[arg(long, value_name = "N")]
    pub window: Option<usize>,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// The API shape of the records: `chat` (`messages`, `tools`, `model`), `responses`
    /// (a Responses request body: `input`, `instructions`, `tools`, `model`), `messages`
    /// (an Anthropic Messages request body: `system`, `messages`, `tools`, `model`).
    #[arg(long, value_enum, default_value_t = ApiShape::Chat)]
    pub api: ApiShape,
    /// Set `max_tokens` (the reply reserve) on every request.
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Price of a cached prompt token relative to an uncached one, for the cost figures.
    #[arg(long, value_name = "PRICE", default_value_t = 0.1)]
    pub cached_price: f64,
    /// Write digests with the configured `[summarizer]` model (real calls, priced with the
    /// rest) instead of the extractive summarizer.
    #[arg(long)]
    pub llm: bool,
    /// Recorded conversations, one JSON object per line.
    #[arg(value_name = "FILE.jsonl")]
    pub file: PathBuf,
}
