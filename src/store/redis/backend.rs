//! Counters in Redis: one atomic Lua call per decision, Redis's own clock, Cluster ready.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::{ErrorKind, RedisError, Script};

use super::cluster::{self, Heading};
use super::cluster_link::ClusterLink;
use super::connecting::LinkConfig;
use super::eval::evaluate;
use super::link::{Endpoint, Link};
use super::sentinel::SentinelMaster;
use super::topology;
use crate::store::algorithm::{Algorithm, PolicyOutcome};
use crate::store::backend::{Backend, CheckOutcome, LeaseGrant, Refund, StoreError};
use crate::store::caller::CallerKey;
use crate::store::digest::KeyedDigest;
use crate::store::domain::FailureDomain;
use crate::store::future::StoreFuture;
use crate::store::policy::Policy;

/// The one script for decisions, leases, refunds and charges: the shared helpers, Redis's clock,
/// then lua/policies.lua with each algorithm's sections of lua/algorithm/ inserted by
/// build.rs, each spelt out inline (Redis runs a script's whole body on every call, so
/// functions defined in it would be built again for every decision).
const SCRIPT_SOURCE: &str = concat!(
    include_str!("../../../lua/common.lua"),
    include_str!("../../../lua/clock.lua"),
    include_str!(concat!(env!("OUT_DIR"), "/policies.lua")),
);

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SCRIPT_SOURCE));

/// The decision of a caller's one token bucket that does not lock out, a common call,
/// in a script of its own (lua/lone.lua made for it): the same key and the same sections
/// of lua/algorithm/token_bucket.lua as the one script's, without its loops over policies,
/// kinds and operations or its helpers, and with its numbers and reply packed.
const BUCKET_SOURCE: &str = concat!(
    include_str!("../../../lua/clock.lua"),
    include_str!(concat!(env!("OUT_DIR"), "/lone_token_bucket.lua")),
);

static BUCKET: LazyLock<Script> = LazyLock::new(|| Script::new(BUCKET_SOURCE));

/// The decision of a caller's one sliding window that does not lock out, in a script of
/// its own (lua/lone.lua made for it), as the lone bucket's: the one script's key and
/// sections, its numbers and reply packed.
const WINDOW_SOURCE: &str = concat!(
    include_str!("../../../lua/clock.lua"),
    include_str!(concat!(env!("OUT_DIR"), "/lone_sliding_window.lua")),
);

static WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(WINDOW_SOURCE));

// A script without keys runs on any node, so a ping also warms a cluster connection.
const PING_SCRIPT: &str = "return 1";
static PING: LazyLock<Script> = LazyLock::new(|| Script::new(PING_SCRIPT));

const DEFAULT_PREFIX: &str = "rl";
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
const DEFAULT_RECONNECT_MIN: Duration = Duration::from_millis(25);
const DEFAULT_RECONNECT_MAX: Duration = Duration::from_millis(250);

/// Counters in Redis, shared by every instance of a service.
///
/// Each decision is one `EVALSHA` of one Lua script that reads, compares and writes all of
/// the caller's policies atomically, with the time taken from `redis.call('TIME')` inside
/// the script, so instances whose clocks disagree still agree on every window. A request is
/// admitted only if every policy admits it; a refused request writes nothing. Every key the
/// script writes gets an expiry: after two windows of silence (or a full refill) a caller's
/// keys are gone. After a restart or `SCRIPT FLUSH` the script is reloaded transparently.
///
/// # Key layout
///
/// `<prefix>:{<caller>}:<counter>`, for example `rl:{acme}:orders:per-second:w1000`, where
/// the counter is [`Policy::counter`](crate::Policy::counter): the limiter's counter scope
/// (its name by default), the policy's name and the unit it counts in. So two limiters on
/// one Redis never share a count, and a caller moved to a tier whose policy of the same
/// name counts in other units does not read a count it cannot interpret.
///
/// All of one caller's keys share the hash tag `{<caller>}`, so they live in one Redis
/// Cluster slot and the script can touch them atomically. Inside the tag the caller key is
/// percent-escaped (`%`, `{`, `}`, `#`, `?`, `~`, and bytes outside printable ASCII become
/// `%XX`), so braces in a caller key can neither move it to another slot nor make it
/// collide with another caller: `acme}` is stored as `rl:{acme%7D}:…`. Keys over 128 bytes
/// appear as `#` and their SHA-256 in hex, the anonymous bucket as `?`. The prefix
/// (default `rl`, one per service) may not contain braces.
///
/// Caller keys appear in Redis key names as they are, readable by anyone who can list
/// keys, read the slowlog or run `MONITOR`. When the key is a credential (an API key), use
/// [`hash_callers`](RedisBackendBuilder::hash_callers): key names then carry a keyed
/// digest of the caller (`rl:{~3f1c…}:…`), the same on every instance given the same
/// secret.
///
/// # Connections
///
/// Three deployments, each reached one way:
///
/// - a single node ([`builder`](Self::builder)), through one multiplexed connection;
/// - a master found through Redis Sentinel ([`sentinel_builder`](Self::sentinel_builder)),
///   through one multiplexed connection to whichever node the Sentinels name as master,
///   asked again whenever that connection is lost or its node is demoted, and moved to the
///   replica the Sentinels announce they promote, so a failover is followed without a
///   restart;
/// - a Redis Cluster ([`cluster_builder`](Self::cluster_builder)), through the redis
///   crate's cluster client, each decision sent to the master that serves the caller's
///   slot (`MOVED`, `ASK` and `TRYAGAIN` are followed, up to 5 per decision: a redirected
///   script never ran, so sending it again is safe).
///
/// Replicas are never read. Connections are made in the background, never inside a
/// decision: building the backend starts making them, and a service starts while Redis is
/// down. A decision made before the first connection is there waits for it within its
/// store timeout, and falls back (the limiter's `not_connected` reason) when that runs
/// out; one made while a lost connection is made again falls back at once, with the same
/// reason. While Redis refuses the connection (it was killed, or nothing listens on its
/// port), decisions fall back at once with the reason `refused`, and [`ping`](Self::ping)
/// answers an [unavailable](StoreError::is_unavailable) error saying the connection was
/// refused. A lost connection is noticed when a call finds it dropped, or within [100 ms of
/// silence and a `PING`](RedisBackendBuilder::response_timeout) when nothing is being
/// asked, and made again at once, then after a jittered backoff of 25 ms doubling to 250 ms
/// ([`reconnect_backoff`](RedisBackendBuilder::reconnect_backoff)): a Redis that comes back
/// (refused, blackholed, or restarted empty) is decided on again within about a second,
/// the limiter's breaker included. Commands are never queued for later or replayed: a
/// decision that could not be made within the response timeout is an error, left to the
/// limiter's failure policy.
///
/// Each master of a cluster is a failure domain of its own
/// ([`FailureDomain`](crate::store::FailureDomain)), labelled with its address: the
/// limiter keeps a circuit breaker per master, so a master that dies sends only its own
/// slots' decisions to the failure policy. A decision that a redirect (`MOVED`, `ASK`)
/// sends on to another master, and that fails there, is that master's failure, not the
/// failure of the master the slot map named. A single node, or a Sentinel master, is one
/// domain (labelled with its address, or the Sentinel master's name).
///
/// Give the limiter its own Redis (or its own cluster), not a shared cache: an eviction
/// policy that drops keys under memory pressure silently resets callers' counters, and a
/// slow neighbour's commands delay every decision.
///
/// ```no_run
/// use tollgate::{Limiter, Policy, Quota, RedisBackend};
///
/// # #[tokio::main] async fn main() -> Result<(), tollgate::store::StoreError> {
/// let store = RedisBackend::builder("redis://127.0.0.1:6380/")
///     .prefix("orders")
///     .build()?;
/// let limiter = Limiter::builder()
///     .name("orders")
///     .backend(store)
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .build();
/// # drop(limiter); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    connection: Connection,
    prefix: Arc<str>,
    connect_timeout: Duration,
    response_timeout: Duration,
    caller_digest: Option<KeyedDigest>,
    membership: Membership,
}

/// Writes `caller` into a key name as the keyed digest of its encoded form (which keeps
/// raw keys, long-key digests and the anonymous bucket apart): `~` and 32 hex digits.
fn push_digested_caller(out: &mut impl TagOut, digest: &KeyedDigest, caller: &CallerKey) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put(b"~");
    for byte in digest.of(caller.encoded()) {
        out.put(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
    }
}

/// Writes `caller`'s hash tag: its keyed digest when keys are digested, else the caller
/// escaped.
fn push_caller_tag(out: &mut impl TagOut, digest: Option<&KeyedDigest>, caller: &CallerKey) {
    match digest {
        Some(digest) => push_digested_caller(out, digest, caller),
        None => push_escaped_caller(out, caller),
    }
}

/// Where a caller's hash tag is written: into a key being built, or into the checksum
/// that finds its slot without building one.
trait TagOut {
    fn put(&mut self, bytes: &[u8]);
}

impl TagOut for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl TagOut for topology::TagSlot {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.add(bytes);
    }
}

#[derive(Clone)]
pub(super) enum Connection {
    /// A single node, or the master Sentinel names, with the label of its failure domain.
    Single {
        link: Link,
        label: Arc<str>,
    },
    Cluster(ClusterLink),
}

impl RedisBackend {
    /// Starts configuring a backend on the single Redis node at `url` (`redis://host:port/db`;
    /// `rediss://` with the `redis-tls` feature). Give it a primary, never a replica.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Target::Single(url.into()))
    }

    /// Starts configuring a backend on a Redis Cluster reached through any of `nodes`.
    ///
    /// ```no_run
    /// use tollgate::RedisBackend;
    /// # #[tokio::main] async fn main() {
    /// let store = RedisBackend::cluster_builder(["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"])
    ///     .build()
    ///     .expect("valid node URLs");
    /// # drop(store); }
    /// ```
    pub fn cluster_builder<I, S>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Target::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    /// Starts configuring a backend on the master that the Redis Sentinels at `sentinels`
    /// (`redis://host:port/` URLs of Sentinels, not of Redis nodes) monitor as `master`.
    ///
    /// The Sentinels are asked where the master is each time a connection is made; the
    /// node they name is used only once `ROLE` there says it is a master. When it dies or
    /// is demoted in a failover, its connection is given up and the Sentinels are asked
    /// again until they name the promoted replica: no restart, and never a replica. `ROLE`
    /// is asked every 100 ms however busy the connection, since a demoted master still
    /// answers the decisions that only read.
    ///
    /// The backend also subscribes to every Sentinel's announcements
    /// (`+failover-state-wait-promotion`, `+switch-master`) and moves to the replica they
    /// promote as soon as `ROLE` there says master, without waiting for the old master to
    /// be demoted: a master cut off from the Sentinels (a partition between them) is
    /// demoted by nobody, and would otherwise go on deciding, beside the new master, for as
    /// long as the partition lasts.
    ///
    /// ```no_run
    /// use tollgate::RedisBackend;
    /// # #[tokio::main] async fn main() {
    /// let store = RedisBackend::sentinel_builder(
    ///     ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
    ///     "limiter",
    /// )
    /// .prefix("orders")
    /// .build()
    /// .expect("valid Sentinel URLs");
    /// # drop(store); }
    /// ```
    pub fn sentinel_builder<I, S>(sentinels: I, master: impl Into<String>) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Target::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master: master.into(),
        })
    }

    /// The Redis key that holds `caller`'s counter for `limit`.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Quota, RedisBackend};
    /// use tollgate::store::CallerKey;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// let limiter = Limiter::builder()
    ///     .name("orders")
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .build();
    /// let limit = &limiter.policies()[0];
    /// assert_eq!(store.key(&CallerKey::new("acme}"), limit), b"rl:{acme%7D}:orders:per-second:w1000");
    /// # }
    /// ```
    pub fn key(&self, caller: &CallerKey, limit: &Policy) -> Vec<u8> {
        self.tagged_key(caller, limit.counter().as_bytes())
    }

    /// The Redis key that holds `caller`'s block by `limit`'s lockout, if it locks out:
    /// `<prefix>:{<caller>}:<lockout counter>`, in the slot of the caller's counters.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, Policy, Quota, RedisBackend};
    /// use tollgate::store::CallerKey;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// let limiter = Limiter::builder()
    ///     .name("otp")
    ///     .policy(
    ///         Policy::sliding_window("wrong-codes", Quota::per_minutes(5, 10))
    ///             .lock_out_for(Duration::from_secs(600)),
    ///     )
    ///     .build();
    /// let limit = &limiter.policies()[0];
    /// assert_eq!(
    ///     store.block_key(&CallerKey::new("203.0.113.7"), limit).unwrap(),
    ///     b"rl:{203.0.113.7}:otp:wrong-codes:lock"
    /// );
    /// # }
    /// ```
    pub fn block_key(&self, caller: &CallerKey, limit: &Policy) -> Option<Vec<u8>> {
        let id = limit.lockout_counter()?;
        Some(self.tagged_key(caller, id.as_bytes()))
    }

    /// `<prefix>:{<caller>}:<suffix>`: a key of `caller`'s, in the slot of all its keys.
    pub(super) fn tagged_key(&self, caller: &CallerKey, suffix: &[u8]) -> Vec<u8> {
        let mut key =
            Vec::with_capacity(self.prefix.len() + caller.encoded().len() * 3 + suffix.len() + 40);
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend_from_slice(b":{");
        self.push_tag(&mut key, caller);
        key.extend_from_slice(b"}:");
        key.extend_from_slice(suffix);
        key
    }

    /// The script's keys for `caller` under `limits`: each policy's counter, then the
    /// block of each that locks out.
    fn keys(&self, caller: &CallerKey, limits: &[Policy]) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = limits.iter().map(|l| self.key(caller, l)).collect();
        keys.extend(limits.iter().filter_map(|l| self.block_key(caller, l)));
        keys
    }

    /// Writes what goes between the braces of `caller`'s keys: the hash tag that puts them
    /// in one slot.
    fn push_tag(&self, out: &mut impl TagOut, caller: &CallerKey) {
        push_caller_tag(out, self.caller_digest.as_ref(), caller);
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Waits until the connection made in the background is there (at most the connect
    /// timeout) and checks that Redis answers: for start-up and health checks. A Redis
    /// that refuses the connection (not started, killed, a closed port) is reported as
    /// such: an [unavailable](StoreError::is_unavailable) error, "refused the connection".
    /// Decisions made before the connection is there wait for it only within their store
    /// timeout, so a service that pings at start-up makes its first decisions on the store.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() {
    /// let store = tollgate::RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// if let Err(error) = store.ping().await {
    ///     eprintln!("Redis is not answering yet ({error}); the failure policy applies until it does");
    /// }
    /// # }
    /// ```
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.connected().await;
        let reply: i64 = self
            .connection
            .clone()
            .run(
                &PING,
                PING_SCRIPT,
                &[],
                &Vec::<u64>::new(),
                self.response_timeout,
            )
            .await?;
        if reply == 1 {
            Ok(())
        } else {
            Err(StoreError::other("unexpected answer to the ping script"))
        }
    }

    pub(super) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Waits until the connection is made, for at most the connect timeout; whether it
    /// is.
    pub(super) async fn connected(&self) -> bool {
        let waited = tokio::time::Instant::now();
        while !self.connection.is_connected() && waited.elapsed() < self.connect_timeout {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.connection.is_connected()
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(super) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    pub(super) fn membership(&self) -> &Membership {
        &self.membership
    }

    /// The script's source, as loaded into Redis (for `redis-benchmark` and for operators
    /// who want to read it): decisions, leases, refunds and charges all run it, but for
    /// the decisions of a caller whose one policy is a token bucket or a sliding window
    /// that does not lock out, which run a script of the same arithmetic made for that
    /// case alone (its numbers and answer packed as binary doubles).
    pub fn script_source() -> &'static str {
        SCRIPT_SOURCE
    }

    /// The SHA-1 that `EVALSHA` calls the script by.
    pub fn script_sha() -> &'static str {
        SCRIPT.get_hash()
    }
}

/// The one script's arguments for a decision of `cost` units on `limits`.
fn decision_args(limits: &[Policy], cost: u64) -> Vec<u64> {
    let mut args = script_args(limits);
    // The script takes a missing cost as 1: one argument less for Redis to read.
    if cost != 1 {
        args.push(cost);
    }
    args
}

/// The script's arguments for `limits`: four numbers per policy (see lua/policies.lua);
/// the cost (and for a lease or a refund, a number and the operation) follow.
pub(crate) fn script_args(limits: &[Policy]) -> Vec<u64> {
    let mut args = Vec::with_capacity(limits.len() * 4);
    for policy in limits {
        // A lockout rides on the kind: ten times its milliseconds plus the kind.
        let locked = |kind: u64| policy.lockout_ms().map_or(kind, |ms| ms * 10 + kind);
        match *policy.algorithm() {
            Algorithm::SlidingWindow { limit, window_ms } => {
                args.extend_from_slice(&[locked(1), limit, window_ms, 0]);
            }
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => args.extend_from_slice(&[locked(2), rate, period_ms, burst]),
            Algorithm::SlidingLog { limit, window_ms } => {
                args.extend_from_slice(&[locked(3), limit, window_ms, 0]);
            }
        }
    }
    args
}

/// The caller inside the hash tag: unambiguous, and never a `}` that would end the tag.
fn push_escaped_caller(out: &mut impl TagOut, caller: &CallerKey) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let (tag, rest) = match caller.encoded().split_first() {
        Some((tag, rest)) => (*tag, rest),
        None => (b'?', &[][..]),
    };
    if caller.is_anonymous() {
        out.put(b"?");
    } else if caller.is_digest() {
        out.put(b"#");
        for byte in rest {
            out.put(&[
                HEX[usize::from(byte >> 4)].to_ascii_lowercase(),
                HEX[usize::from(byte & 15)].to_ascii_lowercase(),
            ]);
        }
    } else if rest.is_empty() {
        // A lone `%` never appears in an escaped key, so the empty key cannot collide.
        debug_assert_eq!(tag, b'=');
        out.put(b"%");
    } else {
        let plain = |byte: &u8| {
            (0x21..0x7f).contains(byte) && !matches!(byte, b'%' | b'{' | b'}' | b'#' | b'?' | b'~')
        };
        // Runs of plain bytes are written whole.
        let mut rest = rest;
        while !rest.is_empty() {
            let run = rest
                .iter()
                .position(|byte| !plain(byte))
                .unwrap_or(rest.len());
            out.put(&rest[..run]);
            let Some((&byte, after)) = rest[run..].split_first() else {
                break;
            };
            out.put(&[
                b'%',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 15)],
            ]);
            rest = after;
        }
    }
}

impl Connection {
    /// Whether a call can be made now.
    fn is_connected(&self) -> bool {
        match self {
            Connection::Single { link, .. } => link.is_connected(),
            Connection::Cluster(cluster) => cluster.is_connected(),
        }
    }

    /// Runs `script` with `keys` and `args` within `timeout`; on timeout the call is
    /// dropped, so nothing is queued or sent later. Without a connection it fails at once
    /// ([`StoreError::not_connected`]).
    pub(super) async fn run<T: redis::FromRedisValue>(
        self,
        script: &Script,
        source: &str,
        keys: &[Vec<u8>],
        args: &(impl redis::ToRedisArgs + Sync),
        timeout: Duration,
    ) -> Result<T, StoreError> {
        // Where a cluster call is headed, kept outside it so that a call given up at the
        // timeout still says which node it was waiting on.
        let heading = Heading::default();
        let call = async {
            match &self {
                Connection::Single { link, .. } => {
                    let (mut connection, outcome) = link.connection().await?;
                    let result = evaluate(&mut connection, script, source, keys, args).await;
                    outcome.record(&result);
                    result.map_err(|error| store_error(&error))
                }
                Connection::Cluster(cluster) => {
                    let connection = cluster.connection().await?;
                    heading.head_for(
                        keys.first()
                            .and_then(|key| cluster.topology().master(topology::slot(key))),
                    );
                    // Redirects (MOVED, ASK, TRYAGAIN) are followed there, never a call
                    // whose reply was lost.
                    cluster::evaluate(
                        &connection,
                        &heading,
                        || cluster.stale(),
                        script,
                        source,
                        keys,
                        args,
                    )
                    .await
                    .map_err(|error| self.failed_at(store_error(&error), &heading))
                }
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(self.failed_at(
                StoreError::timeout(format!("no answer from Redis within {timeout:?}")),
                &heading,
            )),
        }
    }

    /// `error`, of a call that was headed for the node `heading` names: that node's failure
    /// domain, which a redirect may have made another than the one the caller's slot map
    /// named, is the one that failed.
    fn failed_at(&self, error: StoreError, heading: &Heading) -> StoreError {
        match (self, heading.node()) {
            (Connection::Cluster(cluster), Some(node)) => {
                error.with_failure_domain(cluster.topology().id_of(&node))
            }
            _ => error,
        }
    }
}

fn store_error(error: &RedisError) -> StoreError {
    let message = error.to_string();
    if error.is_timeout() {
        StoreError::timeout(message)
    } else if error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_io_error()
        // A cluster node the client has no connection to (it is down, or being reconnected).
        || error.kind() == ErrorKind::ClusterConnectionNotFound
    {
        StoreError::unavailable(message)
    } else {
        StoreError::other(message)
    }
}

fn parse_reply(reply: &[i64], limits: usize) -> Result<CheckOutcome, StoreError> {
    if reply.len() != 2 + 3 * limits {
        return Err(StoreError::other(format!(
            "the decision script returned {} values for {limits} policies",
            reply.len()
        )));
    }
    let counted_at = u64::try_from(reply[reply.len() - 1]).unwrap_or(0);
    let outcomes = reply[1..reply.len() - 1]
        .chunks_exact(3)
        .map(|chunk| PolicyOutcome {
            admitted: chunk[0] == 1,
            remaining: u64::try_from(chunk[1]).unwrap_or(0),
            reset_ms: u64::try_from(chunk[2]).unwrap_or(0),
        })
        .collect();
    Ok(CheckOutcome::new(outcomes).counted_at(counted_at))
}

/// A lone policy's arguments (lua/lone.lua, the `arguments` section of lua/algorithm/): its
/// numbers packed as little-endian doubles, one argument that the script reads with one
/// call. The scripts compute in doubles whatever form the numbers come in, so packing loses
/// nothing.
struct Packed {
    bytes: [u8; 32],
    len: usize,
}

impl Packed {
    /// At most four numbers.
    fn of(numbers: &[u64]) -> Self {
        let mut bytes = [0; 32];
        for (slot, &number) in bytes.chunks_exact_mut(8).zip(numbers) {
            slot.copy_from_slice(&(number as f64).to_le_bytes());
        }
        Self {
            bytes,
            len: 8 * numbers.len().min(4),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// A lone policy's reply: whether it admitted (a byte), then `r`, `t` and the time of the
/// decision as little-endian doubles.
fn parse_lone_reply(reply: &[u8]) -> Result<CheckOutcome, StoreError> {
    let number = |at: usize| {
        let bytes = reply.get(at..at + 8)?.try_into().ok()?;
        // Integers in doubles; a negative one (never written) reads as 0.
        Some(f64::from_le_bytes(bytes) as u64)
    };
    let (Some(&verdict), Some(remaining), Some(reset_ms), Some(counted_at), 25) =
        (reply.first(), number(1), number(9), number(17), reply.len())
    else {
        return Err(StoreError::other(format!(
            "the script of a lone policy returned {} bytes, not 25",
            reply.len()
        )));
    };
    let outcome = PolicyOutcome {
        admitted: verdict == 1,
        remaining,
        reset_ms,
    };
    Ok(CheckOutcome::one(outcome).counted_at(counted_at))
}

impl Backend for RedisBackend {
    fn failure_domain(&self, caller: &CallerKey) -> FailureDomain {
        match &self.connection {
            Connection::Single { link, .. } => link.domain(),
            Connection::Cluster(cluster) if cluster.is_connected() => {
                let mut tag = topology::TagSlot::default();
                self.push_tag(&mut tag, caller);
                cluster.topology().domain(tag.slot())
            }
            Connection::Cluster(cluster) => cluster.domain(),
        }
    }

    fn failure_domain_label(&self, id: u32) -> Option<String> {
        match &self.connection {
            Connection::Single { label, .. } => (id == 0).then(|| label.to_string()),
            Connection::Cluster(cluster) => cluster.topology().label(id),
        }
    }

    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let connection = self.connection.clone();
        let timeout = self.response_timeout;
        // A caller's one policy without a lockout, the commonest call, by a script of its
        // own: its key and packed numbers held inline, not in allocations of their own.
        if let [policy] = &**limits
            && policy.lockout_ms().is_none()
        {
            let lone = match *policy.algorithm() {
                Algorithm::TokenBucket {
                    rate,
                    period_ms,
                    burst,
                } => Some((
                    &*BUCKET,
                    BUCKET_SOURCE,
                    Packed::of(&[rate, period_ms, burst, cost]),
                )),
                Algorithm::SlidingWindow { limit, window_ms } => Some((
                    &*WINDOW,
                    WINDOW_SOURCE,
                    Packed::of(&[limit, window_ms, cost]),
                )),
                Algorithm::SlidingLog { .. } => None,
            };
            if let Some((script, source, args)) = lone {
                let keys = [self.key(caller, policy)];
                return StoreFuture::boxed(async move {
                    let reply: Vec<u8> = connection
                        .run(script, source, &keys, &args.bytes(), timeout)
                        .await?;
                    parse_lone_reply(&reply)
                });
            }
        }
        let keys = self.keys(caller, limits);
        let args = decision_args(limits, cost);
        let count = limits.len();
        StoreFuture::boxed(async move {
            let reply: Vec<i64> = connection
                .run(&SCRIPT, SCRIPT_SOURCE, &keys, &args, timeout)
                .await?;
            parse_reply(&reply, count)
        })
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        let keys = self.keys(caller, limits);
        let mut args = script_args(limits);
        args.extend_from_slice(&[refund.cost(), refund.counted_at_ms()]);
        let connection = self.connection.clone();
        let timeout = self.response_timeout;
        StoreFuture::boxed(async move {
            let _changed: i64 = connection
                .run(&SCRIPT, SCRIPT_SOURCE, &keys, &(args, "refund"), timeout)
                .await?;
            Ok(())
        })
    }

    fn charge(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let keys = self.keys(caller, limits);
        let mut args = script_args(limits);
        args.extend_from_slice(&[units, 0]);
        let count = limits.len();
        let connection = self.connection.clone();
        let timeout = self.response_timeout;
        StoreFuture::boxed(async move {
            let reply: Vec<i64> = connection
                .run(&SCRIPT, SCRIPT_SOURCE, &keys, &(args, "charge"), timeout)
                .await?;
            parse_reply(&reply, count)
        })
    }

    fn lease(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        let keys = self.keys(caller, limits);
        let mut args = script_args(limits);
        args.extend_from_slice(&[cost, units.max(cost)]);
        let count = limits.len();
        let connection = self.connection.clone();
        let timeout = self.response_timeout;
        Some(StoreFuture::boxed(async move {
            let reply: Vec<i64> = connection
                .run(&SCRIPT, SCRIPT_SOURCE, &keys, &(args, "lease"), timeout)
                .await?;
            // The reply has a decision's shape, with the grant in place of the verdict.
            let outcome = parse_reply(&reply, count)?;
            let granted = u64::try_from(reply[0]).unwrap_or(0);
            Ok(LeaseGrant::new(granted, outcome))
        }))
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topology = match self.connection {
            Connection::Single { .. } => "single node",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisBackend")
            .field("topology", &topology)
            .field("prefix", &self.prefix)
            .field("response_timeout", &self.response_timeout)
            .field("hash_callers", &self.caller_digest.is_some())
            .finish()
    }
}

#[derive(Clone, Debug)]
enum Target {
    Single(String),
    Cluster(Vec<String>),
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

/// Configures a [`RedisBackend`].
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::RedisBackend;
/// # #[tokio::main] async fn main() {
/// let store = RedisBackend::builder("redis://127.0.0.1:6380/")
///     .prefix("orders")
///     .connect_timeout(Duration::from_millis(250))
///     .response_timeout(Duration::from_millis(100))
///     .build()
///     .unwrap();
/// # drop(store); }
/// ```
#[derive(Clone)]
pub struct RedisBackendBuilder {
    target: Target,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    reconnect_min: Duration,
    reconnect_max: Duration,
    caller_secret: Option<Vec<u8>>,
    membership: Membership,
}

impl fmt::Debug for RedisBackendBuilder {
    // The secret of `hash_callers` stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field(
                "reconnect_backoff",
                &(self.reconnect_min, self.reconnect_max),
            )
            .field("hash_callers", &self.caller_secret.is_some())
            .field("membership", &self.membership)
            .finish()
    }
}

impl RedisBackendBuilder {
    fn new(target: Target) -> Self {
        Self {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            reconnect_min: DEFAULT_RECONNECT_MIN,
            reconnect_max: DEFAULT_RECONNECT_MAX,
            caller_secret: None,
            membership: Membership::default(),
        }
    }

    /// Names callers in Redis keys by a keyed digest (HMAC-SHA-256 under `secret`, 128
    /// bits in hex) instead of the key itself.
    ///
    /// Use it when the caller key is a credential, such as an API key taken from a header:
    /// without it every key is written in clear into Redis key names, where anyone with
    /// read access to Redis, its slowlog or `MONITOR` can list them. Give every instance of
    /// the service the same secret (from its secret store, not the code): the digest must
    /// be the same everywhere for the instances to share counts. Changing the secret starts
    /// every caller's count afresh.
    ///
    /// ```
    /// use tollgate::{Policy, RedisBackend};
    /// use tollgate::store::{Algorithm, CallerKey};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/")
    ///     .hash_callers(b"a secret shared by every instance")
    ///     .build()
    ///     .unwrap();
    /// let limit = Policy::new("per-second", Algorithm::sliding_window(50, Duration::from_secs(1)));
    /// let key = store.key(&CallerKey::new("sk_live_1234"), &limit);
    /// assert!(!String::from_utf8_lossy(&key).contains("sk_live"));
    /// # }
    /// ```
    pub fn hash_callers(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.caller_secret = Some(secret.as_ref().to_vec());
        self
    }

    /// Bounds of the jittered exponential backoff between failed connection attempts
    /// (default 25 ms doubling to 250 ms; each pause is drawn between half its ceiling and
    /// all of it). A lost connection is tried again at once; the upper bound is about the
    /// longest a Redis that came back waits before this instance connects to it again, and
    /// it adds to the limiter breaker's second. Keep it well under a second.
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = tollgate::RedisBackend::builder("redis://127.0.0.1:6380/")
    ///     .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(100))
    ///     .build()
    ///     .unwrap();
    /// # drop(store); }
    /// ```
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max.max(min);
        self
    }

    /// Puts every key under `prefix` (default `rl`): one prefix per layer keeps two
    /// layers' policies of the same name apart. Braces are not allowed (they would break
    /// the hash tag); `build` rejects them.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one connection attempt may take (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How often this process beats into the store's instance registry, once one is started
    /// on the store ([`InstanceRegistry::start`](crate::InstanceRegistry::start)); default
    /// 1 s, at least 10 ms.
    ///
    /// It must be shorter than the liveness window
    /// ([`instance_live_within`](Self::instance_live_within)), or the registry refuses to
    /// start; a few beats per window (the default is three) keep one slow beat from dropping
    /// an instance from the count.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{InstanceRegistry, RedisBackend};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/")
    ///     .instance_heartbeat(Duration::from_millis(250))
    ///     .build()
    ///     .unwrap();
    /// let registry = InstanceRegistry::start(&store, 4).unwrap();
    /// # drop(registry); }
    /// ```
    pub fn instance_heartbeat(mut self, every: Duration) -> Self {
        self.membership.heartbeat = every.max(Duration::from_millis(10));
        self
    }

    /// How recent a beat must be for an instance to count as live in the store's instance
    /// registry (default 3 s, at least 10 ms). It must be longer than the heartbeat interval
    /// ([`instance_heartbeat`](Self::instance_heartbeat)); a longer window keeps instances
    /// whose beats are slow in the count, and takes longer to drop one that stopped.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{InstanceRegistry, RedisBackend};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/")
    ///     .instance_heartbeat(Duration::from_secs(5))
    ///     .instance_live_within(Duration::from_secs(15))
    ///     .build()
    ///     .unwrap();
    /// let registry = InstanceRegistry::start(&store, 4).unwrap();
    /// # drop(registry); }
    /// ```
    pub fn instance_live_within(mut self, window: Duration) -> Self {
        self.membership.live_within = window.max(Duration::from_millis(10));
        self
    }

    /// Counts this store's instance registries as the instance `id` rather than as this
    /// process.
    ///
    /// By default every registry in a process shares one random id, so a process counts
    /// once however many registries it starts. Name the instance to use a stable id (a pod
    /// name, say), or to run several instances in one process, as a test or a simulation
    /// does, each with a store of its own. Registries that share an id count as one
    /// instance. The id must not be empty or hold control characters, or the registry
    /// refuses to start.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use tollgate::{InstanceRegistry, RedisBackend};
    ///
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/")
    ///     .instance_id("orders-7f9c")
    ///     .build()
    ///     .unwrap();
    /// let registry = InstanceRegistry::start(&store, 4).unwrap();
    /// assert_eq!(registry.id(), "orders-7f9c");
    /// # }
    /// ```
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.membership.id = Some(id.into());
        self
    }

    /// How long one decision may wait for Redis before it is an error (default 500 ms).
    /// The limiter's own store timeout, shorter, sits on top of this one. A connection that
    /// has had no answer for 100 ms is checked with a `PING` (a Sentinel master's is asked
    /// `ROLE` every 100 ms, busy or not), and given up and made again when that gets no
    /// answer within this timeout: that is how a blackholed or frozen Redis is noticed
    /// while the service is idle.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Builds the backend and starts making its connection in the background, so this
    /// succeeds while Redis is down.
    ///
    /// Fails on an invalid URL or prefix, and for a single node or a Sentinel master when
    /// called outside a Tokio runtime (the task that keeps its connection starts at once).
    /// A cluster backend built outside a runtime starts its task at its first decision.
    /// The instance registry's settings are checked when a registry starts on the store
    /// ([`InstanceRegistry::start`](crate::InstanceRegistry::start)).
    pub fn build(self) -> Result<RedisBackend, StoreError> {
        let invalid = |message: String| StoreError::other(message);
        if self.prefix.contains(['{', '}']) {
            return Err(invalid(format!(
                "the key prefix {:?} may not contain braces",
                self.prefix
            )));
        }
        let config = LinkConfig {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            reconnect_min: self.reconnect_min,
            reconnect_max: self.reconnect_max,
        };
        // The task that keeps a single connection is spawned now.
        let runtime = || {
            tokio::runtime::Handle::try_current().map_err(|_| {
                invalid(
                    "a single-node or Sentinel RedisBackend must be built inside a Tokio \
                     runtime (for example in an async main under #[tokio::main])"
                        .to_owned(),
                )
            })
        };
        let connection = match self.target {
            Target::Single(url) => {
                let runtime = runtime()?;
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| invalid(format!("{url}: {e}")))?;
                let label: Arc<str> = client.get_connection_info().addr().to_string().into();
                let link = Link::start(Endpoint::Node(client), config, label.clone(), &runtime);
                Connection::Single { link, label }
            }
            Target::Sentinel { sentinels, master } => {
                let runtime = runtime()?;
                if sentinels.is_empty() {
                    return Err(invalid("at least one Sentinel URL is needed".to_owned()));
                }
                if master.is_empty() {
                    return Err(invalid("the Sentinel master's name is empty".to_owned()));
                }
                let endpoint = SentinelMaster::new(&sentinels, &master)
                    .map_err(|e| invalid(format!("{}: {e}", sentinels.join(","))))?;
                let label: Arc<str> = master.as_str().into();
                let link = Link::start(
                    Endpoint::Sentinel(endpoint),
                    config,
                    format!(
                        "the master {master} of the Sentinels at {}",
                        sentinels.join(",")
                    )
                    .into(),
                    &runtime,
                );
                Connection::Single { link, label }
            }
            Target::Cluster(nodes) => {
                let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.response_timeout)
                    // The client's retries would repeat a script whose reply was lost (it may
                    // have counted) and are the only way it follows redirects: none here,
                    // redirects are followed in `cluster` instead.
                    .retries(0)
                    .build()
                    .map_err(|e| invalid(e.to_string()))?;
                Connection::Cluster(ClusterLink::new(client, config))
            }
        };
        Ok(RedisBackend {
            connection,
            prefix: self.prefix.into(),
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            caller_digest: self.caller_secret.as_deref().map(KeyedDigest::new),
            membership: self.membership,
        })
    }
}

/// This process's membership in a store's instance registry, as the store's builder set
/// it; checked when a registry starts on the store.
#[derive(Clone, Debug)]
pub(super) struct Membership {
    /// How often this instance beats.
    pub(super) heartbeat: Duration,
    /// How recent a beat must be for an instance to count as live.
    pub(super) live_within: Duration,
    /// The instance's id; `None` for the process's.
    pub(super) id: Option<String>,
}

impl Default for Membership {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(1),
            live_within: Duration::from_secs(3),
            id: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(key: &CallerKey) -> String {
        let mut out = Vec::new();
        push_escaped_caller(&mut out, key);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escaping_keeps_callers_apart_and_braces_out() {
        let keys = [
            "acme", "acme}", "{acme}", "acme%7D", "%", "", "#abc", "?", "a b", "rl:{x}:y",
        ];
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            let e = escaped(&CallerKey::new(key));
            assert!(!e.contains(['{', '}']), "{key:?} -> {e}");
            assert!(seen.insert(e.clone()), "{key:?} collides as {e}");
        }
        assert!(seen.insert(escaped(&CallerKey::anonymous())));
        assert!(seen.insert(escaped(&CallerKey::new(vec![b'x'; 500]))));
        assert_eq!(escaped(&CallerKey::new("acme}")), "acme%7D");
    }

    #[test]
    fn a_callers_slot_found_without_a_key_is_the_slot_of_its_keys() {
        let digest = KeyedDigest::new(b"secret");
        let keys = ["acme", "acme}", "a b%c", "", "{x}", "caf\u{e9}"];
        let callers = keys
            .map(CallerKey::new)
            .into_iter()
            .chain([CallerKey::anonymous(), CallerKey::new(vec![b'x'; 500])]);
        for caller in callers {
            for digest in [None, Some(&digest)] {
                let mut tag = Vec::new();
                let mut slot = topology::TagSlot::default();
                push_caller_tag(&mut tag, digest, &caller);
                push_caller_tag(&mut slot, digest, &caller);
                let key = [&b"rl:{"[..], &tag, b"}:orders"].concat();
                assert_eq!(slot.slot(), topology::slot(&key), "{caller:?}, {digest:?}");
            }
        }
    }

    #[test]
    fn replies_of_the_wrong_shape_are_errors() {
        assert!(parse_reply(&[1, 1, 4, 7], 2).is_err());
        let outcome = parse_reply(&[0, 1, 4, 100, 0, 0, 900, 1_234], 2).unwrap();
        assert!(!outcome.admitted());
        assert_eq!(outcome.limits()[1].reset_ms, 900);
        assert_eq!(outcome.counted_at_ms(), 1_234);
    }

    #[test]
    fn a_lone_policy_reply_is_read_whole_or_refused() {
        let mut reply = vec![1];
        for number in [49.0_f64, 0.0, 1_764_000_000_123.0] {
            reply.extend_from_slice(&number.to_le_bytes());
        }
        let outcome = parse_lone_reply(&reply).unwrap();
        assert!(outcome.admitted());
        assert_eq!(outcome.limits()[0].remaining, 49);
        assert_eq!(outcome.counted_at_ms(), 1_764_000_000_123);
        assert!(parse_lone_reply(&reply[..24]).is_err());
        assert!(parse_lone_reply(b"").is_err());
        assert_eq!(Packed::of(&[5, 1_000, 10, 1]).bytes().len(), 32);
        assert_eq!(
            Packed::of(&[5, 1_000, 1]).bytes()[8..16],
            1_000_f64.to_le_bytes()
        );
    }
}
