//! The shared store: conversation state in Redis (or Valkey), so that several foldgate
//! processes behind a load balancer fold a conversation as one process would.
//!
//! Client: the `redis` crate (redis-rs), the maintained Rust client for Redis and
//! Valkey. Its `ConnectionManager` multiplexes every request over one connection, is
//! created without connecting (so foldgate starts while Redis is down) and reconnects by
//! itself after Redis restarts; it speaks TLS (`rediss://`) through rustls, which the
//! proxy already uses.
//!
//! Layout, per conversation (`<p>` is the key prefix, `<key>` the tenant-scoped hash,
//! never a raw session id or credential). Every key of a conversation carries `{<key>}`,
//! a hash tag: in Redis Cluster they all live in one hash slot, on one node, so a
//! request's reads, compare-and-swap and record writes stay single-node operations; the
//! same layout serves a single server.
//! - `<p>{<key>}:s`: a hash of `v` (schema version of the state), `rev` (revision, one
//!   more on every save) and `state` (the state as JSON); it expires `ttl` after last use.
//! - `<p>{<key>}:l`: the summarization lease, a random token that expires by itself.
//! - `<p>windows`: context windows learned from providers' overflow errors, a hash of
//!   model key → tokens (a few entries; expires a week after the last one learned).
//! - `<p>unserved`: the APIs an upstream answered it does not serve, a set of
//!   `<api>|<upstream>` (a few entries; expires a week after the last one learned).
//! - Inspection records (see [`super::record`]), written only when the inspector is on:
//!   `<p>{<key>}:m` the summary (a hash of counters), `<p>{<key>}:r` and `<p>{<key>}:f`
//!   the last requests and folds (lists of JSON, trimmed to the history), `<p>{<key>}:c`
//!   the changes of the last requests (one JSON element per request, the last ten), and
//!   `<p>t:<tenant>` the set of a tenant's keys (a slot of its own, written beside the
//!   record's `MULTI`); each expires `ttl` after last use. An append is one `MULTI`
//!   (counters by `HINCRBY`, lists by `RPUSH` and `LTRIM`), so replicas never lose each
//!   other's entries. The operator's list `SCAN`s every primary of a cluster.
//! - `<p>{<chain key>}:chain`: the conversation's items up to the last response of a
//!   Responses chain (a JSON array text; the key scoped by the caller's credential and
//!   naming the response), set with the `ttl` and deleted once a later response of the
//!   chain is stored.
//!
//! Keys of releases before the hash tags (`<p>s:<key>`, ...) are not read: after an
//! upgrade conversations start afresh and the old keys expire by themselves.
//!
//! A save is one Lua script, a compare-and-swap on `rev`: it writes only if nobody saved
//! since the revision the writer loaded, so concurrent replicas never lose each other's
//! folds unseen. A value of another schema version (a replica of another release) reads
//! as absent and counts as revision 0: it is never decoded, and the next save replaces
//! it.
//!
//! Redis unreachable or slow: every operation gives up after `timeout` and the request
//! goes on without stored state. After a failure the store answers "unavailable" at once,
//! without trying Redis, while a background probe pings it every [`PROBE_INTERVAL`];
//! the first answered ping ends the outage. So an outage costs only the requests that
//! find it one timeout each, and sharing resumes by itself once Redis is back.

use super::{ChainStore, LearnedStore, LeaseStore, RecordStore, StateStore};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;

use super::record::{CHANGES_HISTORY, FoldEntry, RequestEntry, TIERS};
use super::{
    Lease, Loaded, Record, RecordUpdate, Saved, SessionKey, StoreError, StoredState, Summary,
};

/// The learned-windows hash expires a week after the last window learned.
const WINDOWS_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// How often an unreachable Redis is pinged until it answers again.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Compare-and-swap save. KEYS[1] the session hash; ARGV: schema version, expected
/// revision, state, ttl in milliseconds. Returns the new revision, or -1 on conflict.
const SAVE: &str = r"
local stored = redis.call('HMGET', KEYS[1], 'v', 'rev')
local rev = tonumber(stored[2]) or 0
local current = rev
if stored[1] ~= ARGV[1] then current = 0 end
if current ~= tonumber(ARGV[2]) then return -1 end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'rev', rev + 1, 'state', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return rev + 1
";

/// Deletes KEYS[1] if it still holds ARGV[1] (a lease is released only by its holder).
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

mod connection;

pub use connection::{Connection, Timeouts};

use crate::config::RedisMode;

/// Where the Redis store connects and how it keeps keys.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://`, `rediss://`, `valkey://` or `unix://` URLs (may carry a password):
    /// one server, or the seeds of a cluster, or the sentinels.
    pub urls: Vec<String>,
    /// How Redis is deployed.
    pub mode: RedisMode,
    /// The primary's name under Sentinel.
    pub sentinel_master: String,
    /// Prefix of every key.
    pub key_prefix: String,
    /// State of a conversation not used for this long expires.
    pub ttl: Duration,
    /// Time allowed for one operation.
    pub timeout: Duration,
    /// At most this many recently seen conversations are counted locally (the gauge).
    pub max_sessions: usize,
}

/// Why the Redis store could not be created.
#[derive(Debug, thiserror::Error)]
#[error("session.redis_url: {0}")]
pub struct RedisSetupError(String);

/// Conversation state in Redis, shared by every process using the same server and prefix.
pub struct RedisStore<S> {
    conn: Connection,
    prefix: String,
    ttl_ms: u64,
    timeout: Duration,
    save_script: ::redis::Script,
    release_script: ::redis::Script,
    /// Set while Redis is unreachable (operations fail at once; a probe runs).
    down: Arc<AtomicBool>,
    /// Outages of a cluster that ended (a replica took over, or the node came back).
    cluster_recoveries: Arc<std::sync::atomic::AtomicU64>,
    seen: Seen,
    state: PhantomData<fn() -> S>,
}

impl<S> RedisStore<S> {
    /// A store for `options`; connects on first use. Must be called inside a tokio
    /// runtime, which then drives the connection.
    pub fn new(options: &RedisOptions) -> Result<Self, RedisSetupError> {
        let timeouts = Timeouts {
            connect: options.timeout.max(Duration::from_secs(1)),
            response: options.timeout,
            retry: PROBE_INTERVAL,
        };
        let (urls, mode) = (&options.urls, options.mode);
        let conn = Connection::new(urls, mode, &options.sentinel_master, timeouts)
            // The client's message may quote the URL: name the problem only.
            .map_err(|e| RedisSetupError(format!("cannot set up the client ({:?})", e.kind())))?;
        Ok(Self {
            conn,
            prefix: options.key_prefix.clone(),
            ttl_ms: u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX).max(1),
            timeout: options.timeout,
            save_script: ::redis::Script::new(SAVE),
            release_script: ::redis::Script::new(RELEASE),
            down: Arc::new(AtomicBool::new(false)),
            cluster_recoveries: Arc::default(),
            seen: Seen::new(options.ttl, options.max_sessions),
            state: PhantomData,
        })
    }

    /// The key of one part of conversation `key`: `s` state, `l` lease, and of its
    /// inspection record `m` summary, `r` requests, `f` folds. The hash tag keeps every
    /// part in one cluster slot.
    fn part_key(&self, part: &str, key: &SessionKey) -> String {
        format!("{}{{{}}}:{part}", self.prefix, key.as_str())
    }

    fn state_key(&self, key: &SessionKey) -> String {
        self.part_key("s", key)
    }

    fn lease_key(&self, key: &SessionKey) -> String {
        self.part_key("l", key)
    }

    /// The key of one part of an inspection record: `m` summary, `r` requests, `f` folds.
    fn record_key(&self, part: &str, key: &SessionKey) -> String {
        self.part_key(part, key)
    }

    fn tenant_key(&self, tenant: &str) -> String {
        format!("{}t:{tenant}", self.prefix)
    }

    /// The commands that add `key` to its tenant's set (a slot of its own in a cluster,
    /// so apart from the record's transaction).
    fn tenant_pipeline(&self, key: &SessionKey, tenant: &str) -> ::redis::Pipeline {
        let set = self.tenant_key(tenant);
        let mut pipe = ::redis::pipe();
        pipe.cmd("SADD").arg(&set).arg(key.as_str()).ignore();
        pipe.cmd("PEXPIRE").arg(&set).arg(self.ttl_ms).ignore();
        pipe
    }

    /// The commands that add `update` to the record of `key`, as one transaction.
    fn record_pipeline(&self, key: &SessionKey, update: &RecordUpdate) -> ::redis::Pipeline {
        let (m, r, f) =
            (self.record_key("m", key), self.record_key("r", key), self.record_key("f", key));
        let c = self.record_key("c", key);
        let request = &update.request;
        let history = i64::try_from(update.history.max(1)).unwrap_or(i64::MAX);
        let mut pipe = ::redis::pipe();
        pipe.atomic();
        if let Some(tenant) = &update.tenant {
            pipe.cmd("HSETNX").arg(&m).arg("tenant").arg(tenant).ignore();
        }
        pipe.cmd("HSETNX").arg(&m).arg("first_seen").arg(request.at).ignore();
        pipe.cmd("HSET")
            .arg(&m)
            .arg("model")
            .arg(&update.model)
            .arg("last_seen")
            .arg(request.at)
            .arg("tokens_before")
            .arg(request.tokens_before)
            .arg("tokens_after")
            .arg(request.tokens_after)
            .ignore();
        pipe.cmd("HINCRBY").arg(&m).arg("requests").arg(1).ignore();
        pipe.cmd("HINCRBY").arg(&m).arg(format!("t{}", request.tier.min(4))).arg(1).ignore();
        if request.dropped > 0 {
            pipe.cmd("HINCRBY").arg(&m).arg("drops").arg(1).ignore();
        }
        if request.api.is_some() {
            pipe.cmd("HINCRBY").arg(&m).arg("provider_compactions").arg(1).ignore();
        }
        if let Ok(json) = serde_json::to_string(request) {
            pipe.cmd("RPUSH").arg(&r).arg(json).ignore();
            pipe.cmd("LTRIM").arg(&r).arg(-history).arg(-1).ignore();
        }
        // One element per request, so that the last of them is the last request's.
        let changes = serde_json::to_string(&update.changes).unwrap_or_else(|_| "{}".to_owned());
        let kept = history.min(CHANGES_HISTORY as i64);
        pipe.cmd("RPUSH").arg(&c).arg(changes).ignore();
        pipe.cmd("LTRIM").arg(&c).arg(-kept).arg(-1).ignore();
        if !update.folds.is_empty() {
            pipe.cmd("HINCRBY").arg(&m).arg("folds").arg(update.folds.len()).ignore();
            for fold in &update.folds {
                if let Ok(json) = serde_json::to_string(fold) {
                    pipe.cmd("RPUSH").arg(&f).arg(json).ignore();
                }
            }
            pipe.cmd("LTRIM").arg(&f).arg(-history).arg(-1).ignore();
        }
        for part in [&m, &r, &f, &c] {
            pipe.cmd("PEXPIRE").arg(part).arg(self.ttl_ms).ignore();
        }
        pipe
    }

    /// The summaries of `keys` (absent ones left out).
    async fn summaries(&self, keys: Vec<String>) -> Result<Vec<(SessionKey, Summary)>, StoreError> {
        let mut found = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(256) {
            let mut pipe = ::redis::pipe();
            for key in chunk {
                pipe.cmd("HGETALL")
                    .arg(self.record_key("m", &SessionKey::from_digest(key.as_str())));
            }
            let mut conn = self.conn.clone();
            let hashes: Vec<Vec<(String, String)>> = self.run(pipe.query_async(&mut conn)).await?;
            for (key, hash) in chunk.iter().zip(hashes) {
                if !hash.is_empty() {
                    found.push((SessionKey::from_digest(key.as_str()), summary_of(&hash)));
                }
            }
        }
        Ok(found)
    }

    /// The keys of every stored record, at most `max`: a `SCAN` of the server, or of
    /// every primary of a cluster.
    async fn record_keys(&self, max: usize) -> Result<Vec<String>, StoreError> {
        let nodes = match self.conn.primaries().await {
            Some(primaries) => self.run(async { primaries }).await?.into_iter().map(Some).collect(),
            None => vec![None],
        };
        let mut keys = Vec::new();
        for node in &nodes {
            self.scan_records(node.as_ref(), max, &mut keys).await?;
            if keys.len() >= max {
                break;
            }
        }
        Ok(keys)
    }

    /// Adds the record keys `SCAN` finds on `node` (any node outside a cluster) to `keys`,
    /// until there are `max`.
    async fn scan_records(
        &self,
        node: Option<&(String, u16)>,
        max: usize,
        keys: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        let pattern = format!("{}{{*}}:m", self.prefix);
        let head = format!("{}{{", self.prefix);
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = ::redis::cmd("SCAN");
            cmd.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000);
            let (next, batch): (u64, Vec<String>) = self.run(self.conn.query_on(cmd, node)).await?;
            let found = batch.into_iter().filter_map(|k| {
                k.strip_prefix(&head).and_then(|k| k.strip_suffix("}:m")).map(str::to_owned)
            });
            keys.extend(found);
            cursor = next;
            if cursor == 0 || keys.len() >= max {
                return Ok(());
            }
        }
    }

    /// Runs one Redis operation within the timeout, or fails at once while Redis is
    /// known to be down.
    async fn run<T>(
        &self,
        op: impl std::future::Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable("Redis is unreachable; probing".into()));
        }
        let message = match tokio::time::timeout(self.timeout, op).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => describe(&e),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %message, "session store: Redis failed; requests go on without stored state until it answers again");
            let ended = self.conn.is_cluster().then(|| self.cluster_recoveries.clone());
            let down = Arc::downgrade(&self.down);
            tokio::spawn(probe(self.conn.clone(), down, self.timeout, ended));
        }
        Err(StoreError::Unavailable(message))
    }
}

/// Pings Redis every [`PROBE_INTERVAL`] until it answers, then ends the outage. A ping
/// also makes the connection manager reconnect. Ends when the store is dropped.
async fn probe(
    mut conn: Connection,
    down: Weak<AtomicBool>,
    timeout: Duration,
    ended: Option<Arc<std::sync::atomic::AtomicU64>>,
) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(flag) = down.upgrade() else { return };
        let ping = ::redis::cmd("PING");
        if let Ok(Ok(_)) =
            tokio::time::timeout(timeout, ping.query_async::<String>(&mut conn)).await
        {
            flag.store(false, Ordering::Relaxed);
            if let Some(ended) = &ended {
                ended.fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!("session store: Redis answers again; conversations are shared");
            return;
        }
    }
}

/// A Redis error without anything that could quote the URL or a value.
fn describe(e: &::redis::RedisError) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        "connection failed".to_owned()
    } else {
        format!("{:?}", e.kind())
    }
}

#[async_trait]
impl<S: StoredState + Send + Sync + 'static> StateStore<S> for RedisStore<S> {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn load(&self, key: &SessionKey) -> Result<Option<Loaded<S>>, StoreError> {
        let state_key = self.state_key(key);
        let mut conn = self.conn.clone();
        let mut pipe = ::redis::pipe();
        pipe.cmd("HMGET").arg(&state_key).arg("v").arg("rev").arg("state");
        pipe.cmd("PEXPIRE").arg(&state_key).arg(self.ttl_ms).ignore();
        let ((version, revision, state),): ((Option<String>, Option<u64>, Option<Vec<u8>>),) =
            self.run(pipe.query_async(&mut conn)).await?;
        self.seen.touch(key);
        let (Some(version), Some(revision), Some(state)) = (version, revision, state) else {
            return Ok(None);
        };
        if version != S::SCHEMA_VERSION.to_string() {
            tracing::debug!(
                session = key.as_str(),
                stored = version,
                ours = S::SCHEMA_VERSION,
                "stored state of another schema version ignored"
            );
            return Ok(None);
        }
        match serde_json::from_slice::<S>(&state) {
            Ok(state) => Ok(Some(Loaded { state, revision })),
            Err(e) => {
                // Replaced by the next save (its revision is passed on), never trusted.
                tracing::warn!(session = key.as_str(), error = %e, "stored session state is unreadable; starting afresh");
                Ok(Some(Loaded { state: S::default(), revision }))
            }
        }
    }

    async fn save(&self, key: &SessionKey, state: S, revision: u64) -> Result<Saved, StoreError> {
        let json = serde_json::to_vec(&state).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut conn = self.conn.clone();
        let mut invocation = self.save_script.key(self.state_key(key));
        invocation.arg(S::SCHEMA_VERSION).arg(revision).arg(json).arg(self.ttl_ms);
        let written: i64 = self.run(invocation.invoke_async(&mut conn)).await?;
        self.seen.touch(key);
        Ok(if written < 0 { Saved::Conflict } else { Saved::Written })
    }

    fn active_sessions(&self) -> usize {
        self.seen.len()
    }

    fn failovers_seen(&self) -> u64 {
        self.conn.primary_changes() + self.cluster_recoveries.load(Ordering::Relaxed)
    }

    fn sweep(&self) -> usize {
        self.seen.sweep()
    }

    async fn forget(&self, key: &SessionKey) -> Result<bool, StoreError> {
        let mut cmd = ::redis::cmd("DEL");
        cmd.arg(self.state_key(key));
        for part in ["m", "r", "f", "c"] {
            cmd.arg(self.record_key(part, key));
        }
        let mut conn = self.conn.clone();
        let deleted: u64 = self.run(cmd.query_async(&mut conn)).await?;
        Ok(deleted > 0)
    }
}

#[async_trait]
impl<S: StoredState + Send + Sync + 'static> LeaseStore for RedisStore<S> {
    async fn try_lease(
        &self,
        key: &SessionKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut conn = self.conn.clone();
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(self.lease_key(key)).arg(&token).arg("NX").arg("PX").arg(ttl_ms);
        let taken: Option<String> = self.run(cmd.query_async(&mut conn)).await?;
        Ok(taken.map(|_| Lease { token }))
    }

    async fn release(&self, key: &SessionKey, lease: Lease) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.release_script.key(self.lease_key(key));
        invocation.arg(lease.token);
        let _: i64 = self.run(invocation.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn leased(&self, key: &SessionKey) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = ::redis::cmd("EXISTS");
        cmd.arg(self.lease_key(key));
        let held: u64 = self.run(cmd.query_async(&mut conn)).await?;
        Ok(held > 0)
    }
}

#[async_trait]
impl<S: StoredState + Send + Sync + 'static> LearnedStore for RedisStore<S> {
    async fn load_windows(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = ::redis::cmd("HGETALL");
        cmd.arg(format!("{}windows", self.prefix));
        let all: Vec<(String, u64)> = self.run(cmd.query_async(&mut conn)).await?;
        Ok(all)
    }

    async fn save_window(&self, model: &str, tokens: u64) -> Result<(), StoreError> {
        let key = format!("{}windows", self.prefix);
        let mut conn = self.conn.clone();
        let mut pipe = ::redis::pipe();
        pipe.cmd("HSET").arg(&key).arg(model).arg(tokens).ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(WINDOWS_TTL_MS).ignore();
        self.run(pipe.query_async::<()>(&mut conn)).await
    }

    async fn load_unserved(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = ::redis::cmd("SMEMBERS");
        cmd.arg(format!("{}unserved", self.prefix));
        self.run(cmd.query_async(&mut conn)).await
    }

    async fn save_unserved(&self, name: &str) -> Result<(), StoreError> {
        let key = format!("{}unserved", self.prefix);
        let mut conn = self.conn.clone();
        let mut pipe = ::redis::pipe();
        pipe.cmd("SADD").arg(&key).arg(name).ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(WINDOWS_TTL_MS).ignore();
        self.run(pipe.query_async::<()>(&mut conn)).await
    }
}

#[async_trait]
impl<S: StoredState + Send + Sync + 'static> ChainStore for RedisStore<S> {
    async fn load_chain(&self, key: &SessionKey) -> Result<Option<bytes::Bytes>, StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = ::redis::cmd("GET");
        cmd.arg(self.part_key("chain", key));
        let found: Option<Vec<u8>> = self.run(cmd.query_async(&mut conn)).await?;
        Ok(found.map(bytes::Bytes::from))
    }

    async fn save_chain(
        &self,
        key: &SessionKey,
        items: bytes::Bytes,
        replaces: Option<&SessionKey>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut set = ::redis::cmd("SET");
        set.arg(self.part_key("chain", key)).arg(items.as_ref()).arg("PX").arg(self.ttl_ms);
        self.run(set.query_async::<()>(&mut conn)).await?;
        if let Some(old) = replaces {
            // Its own slot in a cluster: a command of its own, best effort.
            let mut del = ::redis::cmd("DEL");
            del.arg(self.part_key("chain", old));
            self.run(del.query_async::<()>(&mut conn)).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl<S: StoredState + Send + Sync + 'static> RecordStore for RedisStore<S> {
    fn record(&self, key: &SessionKey, update: RecordUpdate) {
        if self.down.load(Ordering::Relaxed) {
            return;
        }
        let pipe = self.record_pipeline(key, &update);
        let tenant = update.tenant.as_deref().map(|t| self.tenant_pipeline(key, t));
        let (mut conn, timeout) = (self.conn.clone(), self.timeout);
        tokio::spawn(async move {
            for pipe in std::iter::once(pipe).chain(tenant) {
                let written =
                    tokio::time::timeout(timeout, pipe.query_async::<()>(&mut conn)).await;
                if !matches!(written, Ok(Ok(()))) {
                    tracing::debug!("session store: an inspection record entry was not written");
                    return;
                }
            }
        });
    }

    async fn records(
        &self,
        tenant: Option<&str>,
        max: usize,
    ) -> Result<Vec<(SessionKey, Summary)>, StoreError> {
        let keys = match tenant {
            Some(tenant) => {
                let mut conn = self.conn.clone();
                let mut cmd = ::redis::cmd("SMEMBERS");
                cmd.arg(self.tenant_key(tenant));
                self.run(cmd.query_async::<Vec<String>>(&mut conn)).await?
            }
            None => self.record_keys(max.saturating_mul(4).max(1000)).await?,
        };
        let mut found = self.summaries(keys).await?;
        if let Some(tenant) = tenant {
            found.retain(|(_, s)| s.tenant.as_deref() == Some(tenant));
        }
        found.sort_unstable_by(|a, b| b.1.last_seen.cmp(&a.1.last_seen).then(a.0.cmp(&b.0)));
        found.truncate(max);
        Ok(found)
    }

    async fn record_of(&self, key: &SessionKey) -> Result<Option<Record>, StoreError> {
        let mut pipe = ::redis::pipe();
        pipe.cmd("HGETALL").arg(self.record_key("m", key));
        pipe.cmd("LRANGE").arg(self.record_key("r", key)).arg(0).arg(-1);
        pipe.cmd("LRANGE").arg(self.record_key("f", key)).arg(0).arg(-1);
        pipe.cmd("LRANGE").arg(self.record_key("c", key)).arg(0).arg(-1);
        let mut conn = self.conn.clone();
        let (hash, requests, folds, changes): Listed =
            self.run(pipe.query_async(&mut conn)).await?;
        if hash.is_empty() {
            return Ok(None);
        }
        Ok(Some(Record {
            summary: summary_of(&hash),
            requests: requests
                .iter()
                .filter_map(|j| serde_json::from_str::<RequestEntry>(j).ok())
                .collect(),
            folds: folds.iter().filter_map(|j| serde_json::from_str::<FoldEntry>(j).ok()).collect(),
            // An unreadable element stays in place (empty) so the rest stay aligned.
            changes: changes.iter().map(|j| serde_json::from_str(j).unwrap_or_default()).collect(),
        }))
    }
}

/// A record's hash and its lists of requests, folds and changes, as read.
type Listed = (Vec<(String, String)>, Vec<String>, Vec<String>, Vec<String>);

/// A summary from its Redis hash (fields missing or unreadable count as zero).
fn summary_of(hash: &[(String, String)]) -> Summary {
    let mut summary = Summary::default();
    for (field, value) in hash {
        let number = || value.parse::<u64>().unwrap_or(0);
        let small = || u32::try_from(number()).unwrap_or(u32::MAX);
        match field.as_str() {
            "tenant" => summary.tenant = Some(value.clone()),
            "model" => summary.model.clone_from(value),
            "first_seen" => summary.first_seen = number(),
            "last_seen" => summary.last_seen = number(),
            "requests" => summary.requests = number(),
            "tokens_before" => summary.tokens_before = small(),
            "tokens_after" => summary.tokens_after = small(),
            "folds" => summary.folds = number(),
            "drops" => summary.drops = number(),
            "provider_compactions" => summary.provider_compactions = number(),
            tier => {
                let index = tier.strip_prefix('t').and_then(|n| n.parse::<usize>().ok());
                if let Some(index) = index.filter(|&i| i < TIERS) {
                    summary.tiers[index] = number();
                }
            }
        }
    }
    summary
}

/// The conversations this process used lately, for the active-sessions gauge (Redis
/// holds the state; counting its keys would cost a scan).
struct Seen {
    map: DashMap<SessionKey, Instant>,
    ttl: Duration,
    max: usize,
}

impl Seen {
    fn new(ttl: Duration, max: usize) -> Self {
        Self { map: DashMap::new(), ttl, max: max.max(1) }
    }

    fn touch(&self, key: &SessionKey) {
        if self.map.len() >= self.max && !self.map.contains_key(key) {
            self.sweep();
            if self.map.len() >= self.max {
                return;
            }
        }
        self.map.insert(key.clone(), Instant::now());
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn sweep(&self) -> usize {
        let before = self.map.len();
        let now = Instant::now();
        self.map.retain(|_, seen| now.duration_since(*seen) < self.ttl);
        before.saturating_sub(self.map.len())
    }
}
