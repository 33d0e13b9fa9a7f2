//! Counters in Redis: one atomic Lua call per decision, Redis's own clock, Cluster ready.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind};
use tokio::sync::OnceCell;

use super::{Backend, CheckFuture, CheckOutcome, StoreError, StoreErrorKind};
use crate::algorithm::{Algorithm, Limit, LimitOutcome};
use crate::caller::CallerKey;

/// The decision script: the shared helpers, both algorithms, then the entry point.
const CHECK_SCRIPT: &str = concat!(
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/token_bucket.lua"),
    include_str!("../../lua/check.lua"),
);

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CHECK_SCRIPT));

// A script without keys runs on any node, so a ping also warms a cluster connection.
const PING_SCRIPT: &str = "return 1";
static PING: LazyLock<Script> = LazyLock::new(|| Script::new(PING_SCRIPT));

const DEFAULT_PREFIX: &str = "rl";
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

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
/// `<prefix>:{<caller>}:<policy>`, for example `rl:{acme}:per-second`. All of one caller's
/// keys share the hash tag `{<caller>}`, so they live in one Redis Cluster slot and the
/// script can touch them atomically. Inside the tag the caller key is percent-escaped
/// (`%`, `{`, `}`, `#`, `?`, and bytes outside printable ASCII become `%XX`), so braces in
/// a caller key can neither move it to another slot nor make it collide with another
/// caller: `acme}` is stored as `rl:{acme%7D}:per-second`. Keys over 128 bytes appear as
/// `#` and their SHA-256 in hex, the anonymous bucket as `?`. The prefix (default `rl`,
/// one per layer or per service) may not contain braces.
///
/// # Connections
///
/// A single node is reached through one multiplexed connection that reconnects by itself
/// with jittered exponential backoff; a cluster through the redis crate's cluster client,
/// reading only from primaries and following the cluster through reshards and failovers
/// (`MOVED`, `ASK` and `TRYAGAIN` are followed, up to 5 per decision: a redirected script
/// never ran, so sending it again is safe). Both connect lazily, so a service starts while
/// Redis is down. Commands are never queued for later or replayed: a decision that could
/// not be made within the response timeout is an error, left to the limiter's failure
/// policy.
///
/// Give the limiter its own Redis (or its own cluster), not a shared cache: an eviction
/// policy that drops keys under memory pressure silently resets callers' counters, and a
/// slow neighbour's commands delay every decision.
///
/// ```no_run
/// use tollgate::{Limiter, Policy, Quota, RedisBackend};
///
/// # #[tokio::main] async fn main() -> Result<(), tollgate::StoreError> {
/// let store = RedisBackend::builder("redis://127.0.0.1:6380/")
///     .prefix("orders")
///     .build()?;
/// let limiter = Limiter::builder()
///     .backend(store)
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .build();
/// # drop(limiter); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    connection: Connection,
    prefix: Arc<str>,
    response_timeout: Duration,
}

#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
}

pub(super) struct LazyCluster {
    client: redis::cluster::ClusterClient,
    connection: OnceCell<ClusterConnection>,
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

    /// The Redis key that holds `caller`'s counter for `policy`.
    ///
    /// ```no_run
    /// use tollgate::{CallerKey, RedisBackend};
    /// # #[tokio::main] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// assert_eq!(store.key(&CallerKey::new("acme}"), "per-second"), b"rl:{acme%7D}:per-second");
    /// # }
    /// ```
    pub fn key(&self, caller: &CallerKey, policy: &str) -> Vec<u8> {
        let mut key =
            Vec::with_capacity(self.prefix.len() + caller.encoded().len() * 3 + policy.len() + 4);
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend_from_slice(b":{");
        push_escaped_caller(&mut key, caller);
        key.extend_from_slice(b"}:");
        key.extend_from_slice(policy.as_bytes());
        key
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Connects now (connections are otherwise made on the first decision) and checks that
    /// Redis answers: for start-up and health checks, so the first requests do not pay for
    /// the connection.
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
            Err(StoreError::new(
                StoreErrorKind::Other,
                "unexpected answer to the ping script",
            ))
        }
    }

    pub(super) fn connection(&self) -> &Connection {
        &self.connection
    }

    pub(super) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The decision script's source, as loaded into Redis (for `redis-benchmark` and for
    /// operators who want to read it).
    pub fn script_source() -> &'static str {
        CHECK_SCRIPT
    }

    /// The SHA-1 that `EVALSHA` calls the decision script by.
    pub fn script_sha() -> &'static str {
        SCRIPT.get_hash()
    }
}

/// The script's arguments for `limits`: four numbers per policy (see lua/check.lua).
pub(crate) fn script_args(limits: &[Limit]) -> Vec<u64> {
    let mut args = Vec::with_capacity(limits.len() * 4);
    for limit in limits {
        match *limit.algorithm() {
            Algorithm::SlidingWindow { limit, window_ms } => {
                args.extend_from_slice(&[1, limit, window_ms, 0]);
            }
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => args.extend_from_slice(&[2, rate, period_ms, burst]),
        }
    }
    args
}

/// The caller inside the hash tag: unambiguous, and never a `}` that would end the tag.
fn push_escaped_caller(out: &mut Vec<u8>, caller: &CallerKey) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let (tag, rest) = match caller.encoded().split_first() {
        Some((tag, rest)) => (*tag, rest),
        None => (b'?', &[][..]),
    };
    if caller.is_anonymous() {
        out.push(b'?');
    } else if caller.is_digest() {
        out.push(b'#');
        for byte in rest {
            out.extend_from_slice(&[
                HEX[usize::from(byte >> 4)].to_ascii_lowercase(),
                HEX[usize::from(byte & 15)].to_ascii_lowercase(),
            ]);
        }
    } else if rest.is_empty() {
        // A lone `%` never appears in an escaped key, so the empty key cannot collide.
        debug_assert_eq!(tag, b'=');
        out.push(b'%');
    } else {
        for &byte in rest {
            let plain =
                (0x21..0x7f).contains(&byte) && !matches!(byte, b'%' | b'{' | b'}' | b'#' | b'?');
            if plain {
                out.push(byte);
            } else {
                out.extend_from_slice(&[
                    b'%',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 15)],
                ]);
            }
        }
    }
}

/// `EVALSHA`, or on NOSCRIPT (a restart, a `SCRIPT FLUSH`) `EVAL` with the source, which
/// runs in the same round trip and caches the script again. Unlike load-then-retry, no
/// flush between two commands can make it fail.
pub(super) async fn evaluate<T: redis::FromRedisValue>(
    connection: &mut impl redis::aio::ConnectionLike,
    script: &Script,
    source: &str,
    keys: &[Vec<u8>],
    args: &(impl redis::ToRedisArgs + Sync),
) -> Result<T, RedisError> {
    let command = |name: &str, script: &str| {
        let mut command = redis::cmd(name);
        command.arg(script).arg(keys.len()).arg(keys).arg(args);
        command
    };
    match command("EVALSHA", script.get_hash())
        .query_async(connection)
        .await
    {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            command("EVAL", source).query_async(connection).await
        }
        result => result,
    }
}

impl Connection {
    /// Runs `script` with `keys` and `args` within `timeout`; on timeout the call is
    /// dropped, so nothing is queued or sent later.
    pub(super) async fn run<T: redis::FromRedisValue>(
        self,
        script: &Script,
        source: &str,
        keys: &[Vec<u8>],
        args: &(impl redis::ToRedisArgs + Sync),
        timeout: Duration,
    ) -> Result<T, StoreError> {
        let call = async {
            match self {
                Connection::Single(mut manager) => {
                    evaluate(&mut manager, script, source, keys, args).await
                }
                Connection::Cluster(cluster) => {
                    let connection = cluster
                        .connection
                        .get_or_try_init(|| cluster.client.get_async_connection())
                        .await?;
                    // Redirects (MOVED, ASK, TRYAGAIN) are followed there, never a call
                    // whose reply was lost.
                    super::redis_cluster::evaluate(connection, script, source, keys, args).await
                }
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(error)) => Err(store_error(&error)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer from Redis within {timeout:?}"),
            )),
        }
    }
}

fn store_error(error: &RedisError) -> StoreError {
    let kind = if error.is_timeout() {
        StoreErrorKind::Timeout
    } else if error.is_connection_refusal() || error.is_connection_dropped() || error.is_io_error()
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Other
    };
    StoreError::new(kind, error.to_string())
}

fn parse_reply(reply: &[i64], limits: usize) -> Result<CheckOutcome, StoreError> {
    if reply.len() != 1 + 3 * limits {
        return Err(StoreError::new(
            StoreErrorKind::Other,
            format!(
                "the decision script returned {} values for {limits} policies",
                reply.len()
            ),
        ));
    }
    let outcomes = reply[1..]
        .chunks_exact(3)
        .map(|chunk| LimitOutcome {
            admitted: chunk[0] == 1,
            remaining: u64::try_from(chunk[1]).unwrap_or(0),
            reset_ms: u64::try_from(chunk[2]).unwrap_or(0),
        })
        .collect();
    Ok(CheckOutcome::new(outcomes))
}

impl Backend for RedisBackend {
    fn check(&self, caller: &CallerKey, limits: &Arc<[Limit]>) -> CheckFuture {
        let keys: Vec<Vec<u8>> = limits.iter().map(|l| self.key(caller, l.name())).collect();
        let args = script_args(limits);
        let count = limits.len();
        let connection = self.connection.clone();
        let timeout = self.response_timeout;
        CheckFuture::boxed(async move {
            let reply: Vec<i64> = connection
                .run(&SCRIPT, CHECK_SCRIPT, &keys, &args, timeout)
                .await?;
            parse_reply(&reply, count)
        })
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topology = match self.connection {
            Connection::Single(_) => "single node",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisBackend")
            .field("topology", &topology)
            .field("prefix", &self.prefix)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

#[derive(Clone, Debug)]
enum Target {
    Single(String),
    Cluster(Vec<String>),
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
#[derive(Clone, Debug)]
pub struct RedisBackendBuilder {
    target: Target,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    reconnect_min: Duration,
    reconnect_max: Duration,
}

impl RedisBackendBuilder {
    fn new(target: Target) -> Self {
        Self {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(1),
        }
    }

    /// Bounds of the jittered exponential backoff between reconnection attempts of a
    /// single-node connection (default 50 ms growing to 1 s). The upper bound is about the
    /// longest a recovered Redis waits before this instance uses it again.
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

    /// How long one decision may wait for Redis before it is an error (default 500 ms).
    /// The limiter's own store timeout, shorter, sits on top of this one.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Builds the backend. Connections are made lazily, on the first decision, so this
    /// succeeds while Redis is down; it must run inside a Tokio runtime.
    ///
    /// Fails on an invalid URL or prefix.
    pub fn build(self) -> Result<RedisBackend, StoreError> {
        let invalid = |message: String| StoreError::new(StoreErrorKind::Other, message);
        if self.prefix.contains(['{', '}']) {
            return Err(invalid(format!(
                "the key prefix {:?} may not contain braces",
                self.prefix
            )));
        }
        let connection = match self.target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| invalid(format!("{url}: {e}")))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.response_timeout))
                    .set_min_delay(self.reconnect_min)
                    .set_max_delay(self.reconnect_max)
                    .set_number_of_retries(usize::MAX);
                let manager = ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| invalid(e.to_string()))?;
                Connection::Single(manager)
            }
            Target::Cluster(nodes) => {
                let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.response_timeout)
                    // The client's retries would repeat a script whose reply was lost (it may
                    // have counted) and are the only way it follows redirects: none here,
                    // redirects are followed in `redis_cluster` instead.
                    .retries(0)
                    .build()
                    .map_err(|e| invalid(e.to_string()))?;
                Connection::Cluster(Arc::new(LazyCluster {
                    client,
                    connection: OnceCell::new(),
                }))
            }
        };
        Ok(RedisBackend {
            connection,
            prefix: self.prefix.into(),
            response_timeout: self.response_timeout,
        })
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
    fn replies_of_the_wrong_shape_are_errors() {
        assert!(parse_reply(&[1, 1, 4], 2).is_err());
        let outcome = parse_reply(&[0, 1, 4, 100, 0, 0, 900], 2).unwrap();
        assert!(!outcome.admitted());
        assert_eq!(outcome.limits()[1].reset_ms, 900);
    }
}
