//! One connection to one Redis (a node, or the master that Sentinel names), made and made
//! again in the background, never inside a decision.
//!
//! A task owns the connection's life: it connects (within the connect timeout), publishes
//! the connection, and watches it. A call made before the first connection waits for it
//! (within its own timeout; the connection goes on being made if the call gives up). A
//! call that finds a lost connection fails at once with [`StoreError::not_connected`],
//! without waiting, and the limiter falls back without a call to the store. The
//! connection is given up, and made again at once, when:
//!
//! - a call on it fails because the connection dropped (the server died or restarted, a
//!   proxy cut it), reported by the call itself;
//! - it has had no answer for a health-check interval and a `PING` gets none within the
//!   response timeout: a blackhole, a frozen server, or a cut that no call has met yet
//!   because the service is idle;
//! - for a Sentinel master, a call answers `READONLY`, or `ROLE` (asked every health-check
//!   interval, however busy the connection: a demoted master still answers the calls that
//!   only read) says it is a master no more, or gets no answer within the response timeout:
//!   it was demoted in a failover, and Sentinel is asked for the new one.
//!
//! A Sentinel master's connection is also replaced, without a gap, by one to the master
//! that a Sentinel announces, as soon as `ROLE` there says master (see `sentinel`): a
//! master cut off from the Sentinels still says it is one.
//!
//! Failed attempts are retried after a jittered backoff that doubles from the configured
//! minimum to its maximum (25 ms to 250 ms by default), so a Redis that comes back is
//! connected to again within about the maximum. Commands are never queued while there is
//! no connection, and never replayed.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tokio::sync::Notify;

use super::connecting::{Backoff, LinkConfig};
use super::race::{Either, race};
use super::sentinel::{Followed, SentinelMaster};
use super::sentinel_announcements::Subscriptions;
use crate::store::backend::StoreError;
use crate::store::domain::FailureDomain;

/// How long a connection may go without an answer before it is checked.
pub(super) const HEALTH_CHECK_EVERY: Duration = Duration::from_millis(100);

/// Where the connection goes.
pub(super) enum Endpoint {
    /// One node at a fixed address.
    Node(redis::Client),
    /// The master that the Sentinels name now.
    Sentinel(SentinelMaster),
}

impl Endpoint {
    async fn connect(
        &mut self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        match self {
            Endpoint::Node(client) => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            Endpoint::Sentinel(master) => master.connect(config).await,
        }
    }

    /// Whether the connection must point at a master, checked with `ROLE`, and be given up
    /// when it points at one no more.
    fn follows_the_master(&self) -> bool {
        matches!(self, Endpoint::Sentinel(_))
    }

    /// Starts hearing what the Sentinels announce of the master, for as long as the
    /// returned handle lives (nothing for a node).
    fn subscribe(&self, config: LinkConfig) -> Option<Subscriptions> {
        match self {
            Endpoint::Node(_) => None,
            Endpoint::Sentinel(master) => Some(master.subscribe(config)),
        }
    }

    /// Waits until a Sentinel announces something of the master (never, for a node).
    async fn announcement(&self) {
        match self {
            Endpoint::Node(_) => std::future::pending().await,
            Endpoint::Sentinel(master) => master.announcement().await,
        }
    }

    /// Follows what the Sentinels announced last, if anything is to be followed.
    async fn follow_announcement(&mut self, config: &AsyncConnectionConfig) -> Option<Followed> {
        match self {
            Endpoint::Node(_) => None,
            Endpoint::Sentinel(master) => master.follow_announcement(config).await,
        }
    }
}

/// The connection in use, and which one it is.
struct Connected {
    connection: MultiplexedConnection,
    generation: u64,
}

/// What the calls and the connecting task share.
struct State {
    current: ArcSwapOption<Connected>,
    /// Whether `current` holds a connection: read on every decision.
    connected: AtomicBool,
    /// Whether there ever was a connection; until then calls wait for the first one.
    ever_connected: AtomicBool,
    first_connection: Notify,
    /// The generation of the latest connection a call found lost.
    lost: AtomicU64,
    lost_signal: Notify,
    /// A call got an answer since the last health check.
    answered: AtomicBool,
    follows_the_master: bool,
    /// While there is no connection: what the latest attempt got when it was refused
    /// (nothing listens there: the server was killed, or is not started), so that calls
    /// say so at once instead of waiting for a connection or being reported as a timeout.
    refused: ArcSwapOption<String>,
    /// Whether `refused` holds a message: read by every decision while there is no
    /// connection, where loading `refused` itself takes two locked instructions.
    is_refused: AtomicBool,
}

impl State {
    /// Keeps what the latest attempt to connect got when refused (`None`: it was not).
    fn set_refused(&self, refused: Option<Arc<String>>) {
        self.is_refused.store(refused.is_some(), Ordering::Relaxed);
        self.refused.store(refused);
    }
}

/// Stops the connecting task when the last clone of the link is dropped.
struct Task(tokio::task::AbortHandle);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection to one Redis, kept by a task of its own. Cheap to clone; clones share it.
#[derive(Clone)]
pub(super) struct Link {
    state: Arc<State>,
    _task: Arc<Task>,
}

impl Link {
    /// Starts connecting to `endpoint` in the background, on the current Tokio runtime;
    /// `what` names it in logs.
    pub(super) fn start(
        endpoint: Endpoint,
        config: LinkConfig,
        what: Arc<str>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let state = Arc::new(State {
            current: ArcSwapOption::empty(),
            connected: AtomicBool::new(false),
            ever_connected: AtomicBool::new(false),
            first_connection: Notify::new(),
            lost: AtomicU64::new(0),
            lost_signal: Notify::new(),
            answered: AtomicBool::new(false),
            follows_the_master: endpoint.follows_the_master(),
            refused: ArcSwapOption::empty(),
            is_refused: AtomicBool::new(false),
        });
        let task = runtime.spawn(keep_connected(endpoint, config, what, state.clone()));
        Link {
            state,
            _task: Arc::new(Task(task.abort_handle())),
        }
    }

    /// Whether there is a connection to call on now.
    pub(super) fn is_connected(&self) -> bool {
        self.state.connected.load(Ordering::Relaxed)
    }

    /// The link as a failure domain: connected, refused (the latest attempt to connect
    /// was), connecting for the first time, or not connected (lost, being made again).
    pub(super) fn domain(&self) -> FailureDomain {
        // Whether there ever was a connection is read first: the first one is published
        // before the flag is, so a read of no connection after it means one lost since.
        // Read after, the flag could come from a first connection published between the
        // two reads, and a decision of that moment would fall back as if it were lost.
        let ever_connected = self.state.ever_connected.load(Ordering::Acquire);
        if self.is_connected() {
            FailureDomain::WHOLE
        } else if self.state.is_refused.load(Ordering::Relaxed) {
            FailureDomain::WHOLE.refused()
        } else if ever_connected {
            FailureDomain::WHOLE.not_connected()
        } else {
            FailureDomain::WHOLE.connecting()
        }
    }

    /// The connection, and a handle that reports how calls on it went. Until the first
    /// connection is made this waits for it (the caller bounds the wait); once one was
    /// made and lost, a [`StoreError::not_connected`] error comes at once, and while the
    /// latest attempt was refused, an [`unavailable`](StoreError::unavailable) one saying so.
    pub(super) async fn connection(&self) -> Result<(MultiplexedConnection, Outcome), StoreError> {
        loop {
            let first = self.state.first_connection.notified();
            let mut first = std::pin::pin!(first);
            first.as_mut().enable();
            // Read first, as in `domain`.
            let ever_connected = self.state.ever_connected.load(Ordering::Acquire);
            if let Some(connected) = self.state.current.load().as_ref() {
                return Ok((
                    connected.connection.clone(),
                    Outcome {
                        state: self.state.clone(),
                        generation: connected.generation,
                    },
                ));
            }
            if let Some(refused) = self.state.refused.load().as_ref() {
                return Err(StoreError::unavailable(format!(
                    "{refused}; retrying in the background"
                )));
            }
            if ever_connected {
                return Err(StoreError::not_connected(
                    "the connection to Redis was lost: it is being made again in the background",
                ));
            }
            first.await;
        }
    }
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("connected", &self.is_connected())
            .finish()
    }
}

/// Reports how a call on a connection went, so that a lost connection is made again.
pub(super) struct Outcome {
    state: Arc<State>,
    generation: u64,
}

impl Outcome {
    pub(super) fn record<T>(&self, result: &RedisResult<T>) {
        match result {
            Ok(_) => self.state.answered.store(true, Ordering::Relaxed),
            Err(error) if lost(error, self.state.follows_the_master) => {
                self.state.lost.fetch_max(self.generation, Ordering::AcqRel);
                self.state.lost_signal.notify_one();
            }
            // The server answered, with an error of its own: the connection works.
            Err(error) if matches!(error.kind(), ErrorKind::Server(_)) => {
                self.state.answered.store(true, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }
}

/// Whether `error` means the connection is gone, or (following the master) points at a
/// master no more.
fn lost(error: &RedisError, follows_the_master: bool) -> bool {
    error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
        || (error.is_io_error() && !error.is_timeout())
        || (follows_the_master && error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly))
}

/// The task behind a link: connect, publish, watch, and again, for as long as the link
/// lives.
async fn keep_connected(
    mut endpoint: Endpoint,
    config: LinkConfig,
    what: Arc<str>,
    state: Arc<State>,
) {
    let connection_config = config.connection_config();
    let _subscriptions = endpoint.subscribe(config);
    let mut backoff = config.backoff();
    let mut generation = 0u64;
    let mut failing = false;
    loop {
        let attempt =
            tokio::time::timeout(config.connect_timeout, endpoint.connect(&connection_config))
                .await;
        let mut connection = match attempt {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => {
                let refused = error
                    .is_connection_refusal()
                    .then(|| Arc::new(format!("Redis at {what} refused the connection: {error}")));
                let newly_refused = refused.is_some() && !state.is_refused.load(Ordering::Relaxed);
                state.set_refused(refused);
                if newly_refused {
                    // Calls waiting for a first connection learn at once that it is refused.
                    state.first_connection.notify_waiters();
                }
                retrying(&what, &mut failing, &error.to_string());
                pause(&endpoint, &mut backoff).await;
                continue;
            }
            Err(_) => {
                state.set_refused(None);
                retrying(
                    &what,
                    &mut failing,
                    "no connection within the connect timeout",
                );
                pause(&endpoint, &mut backoff).await;
                continue;
            }
        };
        backoff.reset();
        failing = false;
        state.set_refused(None);
        tracing::info!(redis = %what, "connected to Redis");
        let why = loop {
            generation += 1;
            state.current.store(Some(Arc::new(Connected {
                connection: connection.clone(),
                generation,
            })));
            state.connected.store(true, Ordering::Relaxed);
            state.ever_connected.store(true, Ordering::Release);
            state.first_connection.notify_waiters();
            let watched = watch(
                &state,
                &mut endpoint,
                connection,
                generation,
                &config,
                &connection_config,
            )
            .await;
            match watched {
                Watched::Replaced(next) => {
                    tracing::warn!(redis = %what, "moved to the master a Sentinel announced");
                    connection = next;
                }
                Watched::Lost(why) => break why,
            }
        };
        state.connected.store(false, Ordering::Relaxed);
        state.current.store(None);
        tracing::warn!(redis = %what, why, "connection to Redis lost; making it again in the background");
    }
}

/// Waits before the next attempt to connect: the backoff's pause, cut short when a
/// Sentinel announces a new master (the lost master's replica promoted), which is tried at
/// once.
async fn pause(endpoint: &Endpoint, backoff: &mut Backoff) {
    race(tokio::time::sleep(backoff.pause()), endpoint.announcement()).await;
}

/// Logs the first failed attempt of a spell at warn level, the others at debug level.
fn retrying(what: &str, failing: &mut bool, error: &str) {
    if *failing {
        tracing::debug!(redis = %what, error, "cannot connect to Redis yet");
    } else {
        tracing::warn!(redis = %what, error, "cannot connect to Redis; retrying in the background");
        *failing = true;
    }
}

/// How watching a connection ended.
enum Watched {
    /// It is to be given up, for this reason, and a new one made.
    Lost(&'static str),
    /// A connection to the master a Sentinel announced is made: it takes over at once.
    Replaced(MultiplexedConnection),
}

/// Returns when connection `generation` is to be given up (and why), or replaced.
async fn watch(
    state: &State,
    endpoint: &mut Endpoint,
    mut connection: MultiplexedConnection,
    generation: u64,
    config: &LinkConfig,
    connection_config: &AsyncConnectionConfig,
) -> Watched {
    let mut checks = tokio::time::interval(HEALTH_CHECK_EVERY);
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    checks.tick().await;
    loop {
        let announced = match race(
            state.lost_signal.notified(),
            race(checks.tick(), endpoint.announcement()),
        )
        .await
        {
            Either::First(()) => {
                if state.lost.load(Ordering::Acquire) >= generation {
                    return Watched::Lost("a call found it dropped");
                }
                continue;
            }
            Either::Second(Either::First(_)) => false,
            Either::Second(Either::Second(())) => true,
        };
        // A promotion is followed on every check until the replica says it is master.
        let following = tokio::time::timeout(
            config.connect_timeout,
            endpoint.follow_announcement(connection_config),
        )
        .await;
        match following {
            Ok(Some(Followed::Connected(next))) => return Watched::Replaced(next),
            Ok(Some(Followed::Abandon)) => {
                return Watched::Lost("a Sentinel announced another master");
            }
            Ok(Some(Followed::NotYet) | None) | Err(_) => {}
        }
        if announced {
            continue;
        }
        // A plain node that answered since the last check is alive; a Sentinel master is
        // asked its role whatever the traffic.
        if !state.follows_the_master && state.answered.swap(false, Ordering::Relaxed) {
            continue;
        }
        let check = healthy(&mut connection, state.follows_the_master);
        match tokio::time::timeout(config.response_timeout, check).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Watched::Lost("it points at a master no more"),
            Ok(Err(_)) => return Watched::Lost("the health check failed"),
            Err(_) => {
                return Watched::Lost("no answer to the health check within the response timeout");
            }
        }
    }
}

/// `PING`, or for a connection that must point at a master, `ROLE`: whether it still does.
async fn healthy(
    connection: &mut MultiplexedConnection,
    follows_the_master: bool,
) -> RedisResult<bool> {
    if follows_the_master {
        let role: redis::Role = redis::cmd("ROLE").query_async(connection).await?;
        Ok(matches!(role, redis::Role::Primary { .. }))
    } else {
        let _: String = redis::cmd("PING").query_async(connection).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_connection_is_lost_a_timeout_or_a_script_error_is_not() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert!(lost(&io(std::io::ErrorKind::ConnectionReset), false));
        assert!(lost(&io(std::io::ErrorKind::BrokenPipe), false));
        assert!(lost(&io(std::io::ErrorKind::ConnectionRefused), false));
        assert!(!lost(&io(std::io::ErrorKind::TimedOut), false));
        let reply = |text: &str| {
            redis::parse_redis_value(text.as_bytes())
                .and_then(redis::Value::extract_error)
                .expect_err("an error reply")
        };
        let readonly = reply("-READONLY You can't write against a read only replica.\r\n");
        assert!(
            !lost(&readonly, false),
            "a single node's READONLY is its own answer"
        );
        assert!(
            lost(&readonly, true),
            "a Sentinel master that answers READONLY was demoted"
        );
        assert!(!lost(&reply("-ERR user_script:1: boom\r\n"), true));
    }
}
