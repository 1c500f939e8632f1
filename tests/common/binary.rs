//! foldgate as a process: the binary built with the tests, `serve` on a free port with
//! its stderr collected.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

pub const BIN: &str = env!("CARGO_BIN_EXE_foldgate");

pub fn foldgate(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_clear().envs(env.iter().copied());
    cmd
}

/// What a child wrote to stderr, collected by a thread that ends at end of file.
pub struct Logs {
    lines: Arc<std::sync::Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Logs {
    /// Every line, once the child has exited and its stderr is closed (the log writer
    /// thread writes its last lines as the process exits).
    pub fn after_exit(self) -> Vec<String> {
        self.reader.join().unwrap();
        self.lines.lock().unwrap().clone()
    }
}

/// Starts `foldgate serve` on a free port; returns the child, its address, and its
/// stderr lines as they arrive.
pub fn spawn_serve(upstream: &str, extra_env: &[(&str, &str)]) -> (Child, String, Logs) {
    let mut env = vec![
        ("FOLDGATE_LISTEN", "127.0.0.1:0"),
        ("FOLDGATE_UPSTREAM_URL", upstream),
        ("FOLDGATE_SERVER__SHUTDOWN_GRACE", "10s"),
    ];
    env.extend_from_slice(extra_env);
    let mut child = foldgate(&["serve"], &env).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().expect("foldgate exited before listening").unwrap();
        // Text: `listen=127.0.0.1:1234`; JSON: `"listen":"127.0.0.1:1234"`.
        if let Some(rest) =
            line.split("listen=").nth(1).or_else(|| line.split("\"listen\":\"").nth(1))
        {
            break rest.split(['"', ' ']).next().unwrap().to_owned();
        }
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    let collected = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = collected.clone();
    let reader = std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    (child, addr, Logs { lines: collected, reader })
}
