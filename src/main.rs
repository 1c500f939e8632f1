//! The `foldgate` binary: parse the command line, load configuration, run.

use std::process::ExitCode;

use clap::Parser;
use foldgate::cli::{Cli, Command};
use foldgate::config::{Config, ConfigSource, resolve_file};

/// A thread-caching allocator (mimalloc): the proxy path allocates and frees small
/// buffers and headers on every request, on several threads.
#[global_allocator]
static ALLOCATOR: foldgate::allocator::Allocator = foldgate::allocator::Allocator;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => match load(args.config.as_deref()) {
            Ok(config) => foldgate::app::serve(config),
            Err(code) => code,
        },
        Command::CheckConfig(args) => match load(args.config.as_deref()) {
            Ok(config) => {
                #[allow(clippy::print_stdout)]
                {
                    print!("{}", config.to_toml_masked());
                }
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Compact(args) => foldgate::commands::compact::run(&args),
        Command::Replay(args) => foldgate::commands::replay::run(&args),
    }
}

/// Loads the configuration, printing the error and choosing the exit code on failure.
fn load(file: Option<&std::path::Path>) -> Result<Config, ExitCode> {
    let mut source = ConfigSource::from_process(None);
    source.file = resolve_file(file, &source.env);
    Config::load(&source).map_err(|e| {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("foldgate: configuration error: {e}");
        }
        ExitCode::from(2)
    })
}
