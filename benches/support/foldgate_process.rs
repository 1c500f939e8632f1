//! Starting the `foldgate` binary for a benchmark: its configuration comes only from
//! what the bench sets, never from the environment the bench was started in.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

/// `<bin> serve` listening on `listen` and forwarding to the mock at `upstream`, logging
/// at `warn`; every `FOLDGATE_*` variable and `RUST_LOG` of the caller removed.
pub fn serve_command(bin: &Path, listen: SocketAddr, upstream: SocketAddr) -> Command {
    let mut command = Command::new(bin);
    command.arg("serve").env_remove("RUST_LOG");
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("FOLDGATE_")) {
        command.env_remove(key);
    }
    command
        .env("FOLDGATE_LISTEN", listen.to_string())
        .env("FOLDGATE_UPSTREAM_URL", format!("http://{upstream}/v1"))
        .env("FOLDGATE_LOG__LEVEL", "warn");
    command
}
