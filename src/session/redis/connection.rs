//! The connection to Redis in each deployment (`session.redis_mode`), through the client
//! crate's own support: one server through a [`ConnectionManager`] (reconnects by
//! itself); Redis Cluster through its cluster connection (slot map, `MOVED` / `ASK`
//! redirections, topology refresh after a failover); Sentinel through the primary the
//! sentinels name, asked again after any failure that may mean the primary moved (a
//! refused connection, a `READONLY` answer from a demoted primary). All three are one
//! [`Connection`] the store sends commands and pipelines on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};

use crate::config::RedisMode;

/// A connection to Redis, whatever its deployment. Cheap to clone (shared inside).
#[derive(Clone)]
pub enum Connection {
    /// One server.
    Standalone(ConnectionManager),
    /// Redis Cluster: connected on first use.
    Cluster(Arc<LazyCluster>),
    /// The primary the sentinels name.
    Sentinel(Arc<SentinelPrimary>),
}

/// How long to wait for a connection and for an answer.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Connecting.
    pub connect: Duration,
    /// One answer.
    pub response: Duration,
    /// Between reconnection attempts, at most.
    pub retry: Duration,
}

impl Connection {
    /// A connection for `urls` (comma-separated seeds in cluster and sentinel mode) in
    /// `mode`; connects on first use. `master`: the primary's name under Sentinel.
    pub fn new(
        urls: &[String],
        mode: RedisMode,
        master: &str,
        timeouts: Timeouts,
    ) -> Result<Self, RedisError> {
        match mode {
            RedisMode::Standalone => {
                let url = urls.first().map_or("", String::as_str);
                let client = redis::Client::open(url)?;
                let conn = ConnectionManager::new_lazy_with_config(client, manager(timeouts))?;
                Ok(Self::Standalone(conn))
            }
            RedisMode::Cluster => {
                let client = ClusterClient::builder(urls.to_vec())
                    .connection_timeout(timeouts.connect)
                    .response_timeout(timeouts.response)
                    .retries(1)
                    .build()?;
                Ok(Self::Cluster(Arc::new(LazyCluster { client, conn: Default::default() })))
            }
            RedisMode::Sentinel => {
                Ok(Self::Sentinel(Arc::new(SentinelPrimary::new(urls, master, timeouts)?)))
            }
        }
    }

    /// Primary changes seen: under Sentinel, times the sentinels named another primary;
    /// elsewhere none (a cluster's failovers show as outages that end).
    pub fn primary_changes(&self) -> u64 {
        match self {
            Self::Sentinel(primary) => primary.changes.load(std::sync::atomic::Ordering::Relaxed),
            Self::Standalone(_) | Self::Cluster(_) => 0,
        }
    }

    /// True for Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// The addresses of the cluster's primaries (`host`, `port`), for commands every
    /// primary must answer (`SCAN`); `None` outside cluster mode.
    pub async fn primaries(&self) -> Option<Result<Vec<(String, u16)>, RedisError>> {
        let Self::Cluster(cluster) = self else { return None };
        Some(cluster.primaries().await)
    }

    /// Runs `cmd` on the cluster node at `address` (cluster mode), else as any command.
    pub async fn query_on<T: redis::FromRedisValue>(
        &self,
        cmd: Cmd,
        address: Option<&(String, u16)>,
    ) -> Result<T, RedisError> {
        match (self, address) {
            (Self::Cluster(cluster), Some((host, port))) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let mut conn = cluster.get().await?;
                let route = SingleNodeRoutingInfo::ByAddress { host: host.clone(), port: *port };
                let value = conn.route_command(cmd, RoutingInfo::SingleNode(route)).await?;
                redis::from_redis_value(value).map_err(Into::into)
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }
}

fn manager(timeouts: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.response))
        .set_number_of_retries(1)
        .set_max_delay(timeouts.retry)
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Standalone(conn) => conn.req_packed_command(cmd),
            Self::Cluster(cluster) => Box::pin(async move {
                let mut conn = cluster.get().await?;
                conn.req_packed_command(cmd).await
            }),
            Self::Sentinel(primary) => Box::pin(async move {
                let mut conn = primary.get().await?;
                let result = conn.req_packed_command(cmd).await;
                primary.check(result)
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Standalone(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(cluster) => Box::pin(async move {
                let mut conn = cluster.get().await?;
                conn.req_packed_commands(pipeline, offset, count).await
            }),
            Self::Sentinel(primary) => Box::pin(async move {
                let mut conn = primary.get().await?;
                let result = conn.req_packed_commands(pipeline, offset, count).await;
                primary.check(result)
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Standalone(conn) => conn.get_db(),
            Self::Cluster(_) | Self::Sentinel(_) => 0,
        }
    }
}

/// A cluster connection made on first use (the store is built outside any runtime's
/// reach of the servers); a failed attempt is made again by the next command.
pub struct LazyCluster {
    client: ClusterClient,
    conn: tokio::sync::OnceCell<ClusterConnection>,
}

impl LazyCluster {
    async fn get(&self) -> Result<ClusterConnection, RedisError> {
        let conn = self.conn.get_or_try_init(|| self.client.get_async_connection()).await?;
        Ok(conn.clone())
    }

    /// The primaries' addresses, from `CLUSTER SHARDS`'s older sibling `CLUSTER NODES`
    /// (available on every version).
    async fn primaries(&self) -> Result<Vec<(String, u16)>, RedisError> {
        let mut conn = self.get().await?;
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await?;
        Ok(nodes.lines().filter_map(primary_address).collect())
    }
}

/// The address of a `CLUSTER NODES` line's node when it is a primary that is up:
/// `<id> <ip:port@cport[,hostname]> <flags> ...`.
fn primary_address(line: &str) -> Option<(String, u16)> {
    let mut fields = line.split_whitespace();
    let (_, address, flags) = (fields.next()?, fields.next()?, fields.next()?);
    let flags: Vec<&str> = flags.split(',').collect();
    if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
        return None;
    }
    let address = address.split(['@', ',']).next()?;
    let (host, port) = address.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// The primary the sentinels name, asked again whenever a command fails in a way that
/// may mean it moved.
pub struct SentinelPrimary {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<ConnectionManager>>,
    /// The address of the last primary the sentinels named.
    address: Mutex<Option<String>>,
    /// Times the sentinels named another primary than before.
    changes: std::sync::atomic::AtomicU64,
    timeouts: Timeouts,
}

impl SentinelPrimary {
    fn new(urls: &[String], master: &str, timeouts: Timeouts) -> Result<Self, RedisError> {
        // The primary is reached with the sentinels' database, user and password.
        let first = urls.first().map_or("", String::as_str).into_connection_info()?;
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(first.redis_settings().clone());
        let sentinel =
            SentinelClient::build(urls.to_vec(), master, Some(node), SentinelServerType::Master)?;
        Ok(Self {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            address: Mutex::new(None),
            changes: std::sync::atomic::AtomicU64::new(0),
            timeouts,
        })
    }

    /// The connection to the current primary, asking the sentinels when none is known.
    async fn get(&self) -> Result<ConnectionManager, RedisError> {
        if let Some(conn) = self.current.lock().ok().and_then(|c| c.clone()) {
            return Ok(conn);
        }
        let client = self.sentinel.lock().await.async_get_client().await?;
        let named = client.get_connection_info().addr().to_string();
        if let Ok(mut address) = self.address.lock() {
            if address.as_ref().is_some_and(|before| *before != named) {
                self.changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!("session store: the sentinels name a new Redis primary");
            }
            *address = Some(named);
        }
        let conn = ConnectionManager::new_lazy_with_config(client, manager(self.timeouts))?;
        if let Ok(mut current) = self.current.lock() {
            *current = Some(conn.clone());
        }
        Ok(conn)
    }

    /// `result` as it is; after a failure that may mean the primary moved, the next
    /// command asks the sentinels again.
    fn check<T>(&self, result: Result<T, RedisError>) -> Result<T, RedisError> {
        if let Err(e) = &result {
            let moved = e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
            if moved {
                if let Ok(mut current) = self.current.lock() {
                    *current = None;
                }
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::primary_address;

    #[test]
    fn primaries_are_read_from_cluster_nodes() {
        let nodes = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,h replica e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 master,fail - 0 1426238316232 5 connected";
        let primaries: Vec<_> = nodes.lines().filter_map(primary_address).collect();
        assert_eq!(
            primaries,
            vec![("127.0.0.1".to_owned(), 30002), ("127.0.0.1".to_owned(), 30001)]
        );
    }
}
