//! A real `redis-server` process on a free loopback port, started and stopped by the
//! test (never a server started by hand). Missing `redis-server` fails under CI, where
//! `.ci/run` installs it, and skips with the reason printed elsewhere.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// Arguments beyond the port and persistence (cluster mode, a primary to follow).
    extra: Vec<String>,
}

/// True when `redis-server` can run here (else skipped, or failed under CI).
pub fn available() -> bool {
    super::tools::tool_available("redis-server", "redis-server")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl RedisServer {
    /// Starts a server on a free port; `None` (reason printed) when there is none to run.
    pub fn start() -> Option<Self> {
        available().then(|| Self::start_with(free_port(), Vec::new()))
    }

    /// Starts a server on `port` with `extra` arguments (the caller checked
    /// [`available`]).
    pub fn start_with(port: u16, extra: Vec<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("foldgate-redis-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self { child: None, port, dir, extra };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.join("redis.log")).unwrap();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Kills the server (its data is gone: nothing is persisted).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// A connection for the test's own commands.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A frozen server ignores SIGKILL until resumed on some systems: resume first.
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
