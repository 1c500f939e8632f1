//! Real Redis deployments on loopback, started and stopped by the test: a Redis Cluster
//! of six `redis-server` processes (three primaries, a replica each, made by
//! `redis-cli --cluster create`) and a Sentinel setup (a primary, a replica, three
//! `redis-sentinel` processes). Missing programs fail under CI, where `.ci/run` installs
//! them, and skip with the reason printed elsewhere.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::{RedisServer, free_port};

/// True when the cluster can be made here.
pub fn cluster_available() -> bool {
    super::redis_server::available() && super::tools::tool_available("redis-cli", "redis-tools")
}

/// True when the Sentinel setup can be made here.
pub fn sentinel_available() -> bool {
    super::redis_server::available()
        && super::tools::tool_available("redis-sentinel", "redis-sentinel")
}

/// Runs `redis-cli -p <port> <args>`; its output.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli").args(["-p", &port.to_string()]).args(args).output();
    String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
}

/// Waits until `ready` holds, at most `within`.
fn wait_until(within: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Six nodes in cluster mode: three primaries, one replica each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts and joins the nodes; `None` (reason printed) when they cannot run here.
    pub fn start() -> Option<Self> {
        if !cluster_available() {
            return None;
        }
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                let port = free_port();
                let conf = format!("nodes-{port}.conf");
                let args = ["--cluster-enabled", "yes", "--cluster-config-file", &conf];
                let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
                args.extend(["--cluster-node-timeout".to_owned(), "1000".to_owned()]);
                RedisServer::start_with(port, args)
            })
            .collect();
        let addresses: Vec<String> =
            nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create");
        let cluster = Self { nodes };
        cluster.wait_healthy();
        Some(cluster)
    }

    /// The seed URLs, comma-separated.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        urls.join(",")
    }

    /// Waits until every live node says the cluster is ok and agrees on three primaries.
    pub fn wait_healthy(&self) {
        wait_until(Duration::from_secs(30), "cluster_state:ok on every node", || {
            self.live().all(|n| cli(n.port, &["cluster", "info"]).contains("cluster_state:ok"))
        });
    }

    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| std::net::TcpStream::connect(("127.0.0.1", n.port)).is_ok())
    }

    /// The port of the primary serving `key`'s slot.
    pub fn primary_of(&self, key: &str) -> u16 {
        self.serving(key).unwrap_or_else(|| panic!("no primary serves {key}"))
    }

    /// The port of the primary that is up and serves `key`'s slot, if any.
    fn serving(&self, key: &str) -> Option<u16> {
        let any = self.live().next()?.port;
        let slot: u16 = cli(any, &["cluster", "keyslot", key]).trim().parse().ok()?;
        let nodes = cli(any, &["cluster", "nodes"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            for range in &fields[8..] {
                let (start, end) = range.split_once('-').unwrap_or((range, range));
                let (Ok(start), Ok(end)) = (start.parse::<u16>(), end.parse::<u16>()) else {
                    continue;
                };
                if (start..=end).contains(&slot) {
                    let address = fields[1].split('@').next()?;
                    return address.rsplit_once(':')?.1.parse().ok();
                }
            }
        }
        None
    }

    /// Kills the node on `port`.
    pub fn kill(&mut self, port: u16) {
        self.nodes.iter_mut().find(|n| n.port == port).unwrap().kill();
    }

    /// Waits until `key`'s slot is served by a primary other than `old` and the cluster
    /// is healthy again.
    pub fn wait_failover(&self, key: &str, old: u16) {
        wait_until(Duration::from_secs(30), "a replica promoted", || {
            self.serving(key).is_some_and(|port| port != old)
        });
        self.wait_healthy();
    }
}

/// A primary, its replica and three sentinels watching them as `mymaster`.
pub struct RedisSentinel {
    pub primary: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<Sentinel>,
}

/// The primary's name the sentinels monitor.
pub const MASTER: &str = "mymaster";

struct Sentinel {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisSentinel {
    /// Starts the servers and sentinels; `None` (reason printed) when they cannot run.
    pub fn start() -> Option<Self> {
        if !sentinel_available() {
            return None;
        }
        let primary = RedisServer::start_with(free_port(), Vec::new());
        let follow =
            vec!["--replicaof".to_owned(), "127.0.0.1".to_owned(), primary.port.to_string()];
        let replica = RedisServer::start_with(free_port(), follow);
        let sentinels = (0..3).map(|_| Sentinel::start(primary.port)).collect();
        let setup = Self { primary, replica, sentinels };
        wait_until(Duration::from_secs(20), "the sentinels see the replica", || {
            setup.sentinels.iter().all(|s| {
                cli(s.port, &["sentinel", "replicas", MASTER])
                    .contains(&setup.replica.port.to_string())
            })
        });
        Some(setup)
    }

    /// The sentinels' URLs, comma-separated.
    pub fn urls(&self) -> String {
        let urls: Vec<String> =
            self.sentinels.iter().map(|s| format!("redis://127.0.0.1:{}", s.port)).collect();
        urls.join(",")
    }

    /// The port of the primary the sentinels name now.
    pub fn current_primary(&self) -> u16 {
        let answer = cli(self.sentinels[0].port, &["sentinel", "get-master-addr-by-name", MASTER]);
        answer.lines().nth(1).and_then(|p| p.trim().parse().ok()).unwrap_or(0)
    }

    /// Kills the primary and waits until the sentinels promoted the replica.
    pub fn fail_over(&mut self) {
        let old = self.primary.port;
        self.primary.kill();
        let replica = self.replica.port;
        wait_until(Duration::from_secs(30), "the sentinels promote the replica", || {
            self.current_primary() == replica && cli(replica, &["role"]).starts_with("master")
        });
        assert_ne!(old, replica);
    }
}

impl Sentinel {
    fn start(primary: u16) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("foldgate-sentinel-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\n\
                 sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 5000\n\
                 sentinel parallel-syncs {MASTER} 1\n"
            ),
        )
        .unwrap();
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(10), "redis-sentinel listens", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Self { port, child, dir }
    }
}
