//! Child processes of a benchmark, stopped when dropped (also when a panic unwinds), and
//! starting the `foldgate` binary among them: its configuration comes only from what the
//! bench sets, never from the environment the bench was started in.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How a bench runs foldgate, beyond [`serve_command`]'s settings.
pub struct FoldgateOptions<'a> {
    /// The binary.
    pub bin: PathBuf,
    /// The mock provider it forwards to.
    pub upstream: SocketAddr,
    /// `compaction.enabled`.
    pub compaction: bool,
    /// More settings (`FOLDGATE_*` variables), applied after the others.
    pub env: Vec<(&'a str, String)>,
    /// Its working directory, else the bench's.
    pub dir: Option<&'a Path>,
    /// The file its output goes to, else the bench's own output.
    pub log: Option<PathBuf>,
}

/// Starts foldgate (its own connection threads and compaction runtime, as in
/// production) on a free loopback port and waits until it accepts connections.
pub fn start_foldgate(options: FoldgateOptions<'_>) -> ChildGuard {
    let addr = free_port();
    let mut command = serve_command(&options.bin, addr, options.upstream);
    command
        .env("FOLDGATE_COMPACTION__ENABLED", options.compaction.to_string())
        .envs(options.env.iter().map(|(k, v)| (*k, v.as_str())));
    if let Some(dir) = options.dir {
        command.current_dir(dir);
    }
    ChildGuard::spawn("foldgate", command, addr, options.log)
}

/// `<bin> serve` listening on `listen` and forwarding to the mock at `upstream`, logging
/// at `warn`; every `FOLDGATE_*` and `OTEL_*` variable and `RUST_LOG` of the caller
/// removed (a caller's OpenTelemetry settings would turn trace export on).
fn serve_command(bin: &Path, listen: SocketAddr, upstream: SocketAddr) -> Command {
    let mut command = Command::new(bin);
    command.arg("serve").env_remove("RUST_LOG");
    for (key, _) in
        std::env::vars().filter(|(k, _)| k.starts_with("FOLDGATE_") || k.starts_with("OTEL_"))
    {
        command.env_remove(key);
    }
    command
        .env("FOLDGATE_LISTEN", listen.to_string())
        .env("FOLDGATE_UPSTREAM_URL", format!("http://{upstream}/v1"))
        .env("FOLDGATE_LOG__LEVEL", "warn");
    command
}

/// A free loopback port (taken again by the process started on it).
pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A server started by the bench, listening on `addr`.
pub struct ChildGuard {
    /// What it is, for messages.
    name: &'static str,
    /// The process.
    pub child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The file its output goes to, if not the bench's own output.
    log: Option<PathBuf>,
}

impl ChildGuard {
    /// Starts `command` (`name`), its output to `log` (else the bench's own), and waits
    /// up to 10 s until it listens on `addr`; panics with its output if it exits first.
    pub fn spawn(
        name: &'static str,
        mut command: Command,
        addr: SocketAddr,
        log: Option<PathBuf>,
    ) -> Self {
        command.stdin(Stdio::null());
        if let Some(log) = &log {
            let out = std::fs::File::create(log).unwrap();
            command.stdout(out.try_clone().unwrap()).stderr(out);
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let mut guard = Self { name, child, addr, log };
        guard.wait_listening();
        guard
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(self.addr).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = self.log.as_ref().and_then(|l| std::fs::read_to_string(l).ok());
                let log = log.unwrap_or_default();
                panic!("{} exited with {status} before listening:\n{log}", self.name);
            }
            assert!(Instant::now() < deadline, "{} is not listening on {}", self.name, self.addr);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SIGTERM first: nginx's master then stops its workers (SIGKILL would orphan them).
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).stderr(Stdio::null()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
