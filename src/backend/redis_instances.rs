//! A registry of live instances in Redis, kept by heartbeats: the divisor of a local share.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::redis::RedisBackend;
use crate::instances::LiveInstances;

const HEARTBEAT_SCRIPT: &str = include_str!("../../lua/heartbeat.lua");
static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| Script::new(HEARTBEAT_SCRIPT));

/// Counts the live instances of a service through heartbeats in Redis.
///
/// Every instance beats into a sorted set, `<prefix>:instances`, once a second (Redis's
/// clock scores the beats); an instance is live if it beat within the last 3 s. The count
/// is refreshed by a background task, never on the request path; through an outage the
/// last known count is kept, and it is never below 1. The task stops when the last clone of
/// the registry is dropped, and the others stop counting that instance within the liveness
/// window.
///
/// ```no_run
/// use tollgate::{FailurePolicy, InstanceCount, InstanceRegistry, Limiter, Policy, Quota, RedisBackend};
///
/// # #[tokio::main] async fn main() {
/// let store = RedisBackend::builder("redis://127.0.0.1:6380/").prefix("orders").build().unwrap();
/// let registry = InstanceRegistry::builder(&store).start();
/// let limiter = Limiter::builder()
///     .backend(store)
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     // While Redis is down, each instance enforces 50 / (live instances).
///     .on_store_failure(FailurePolicy::local_share(InstanceCount::live(registry)))
///     .build();
/// # drop(limiter); }
/// ```
#[derive(Clone)]
pub struct InstanceRegistry {
    shared: Arc<Shared>,
}

struct Shared {
    count: Arc<AtomicU64>,
    id: String,
    key: String,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

impl InstanceRegistry {
    /// Starts configuring a registry in `store`'s Redis, under its prefix.
    pub fn builder(store: &RedisBackend) -> InstanceRegistryBuilder {
        InstanceRegistryBuilder {
            store: store.clone(),
            every: Duration::from_secs(1),
            live_within: Duration::from_secs(3),
            initial: 1,
        }
    }

    /// This instance's id in the registry.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The registry's key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }
}

impl LiveInstances for InstanceRegistry {
    fn live_instances(&self) -> u64 {
        self.shared.count.load(Ordering::Relaxed).max(1)
    }
}

impl fmt::Debug for InstanceRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstanceRegistry")
            .field("id", &self.shared.id)
            .field("key", &self.shared.key)
            .field("live_instances", &self.live_instances())
            .finish()
    }
}

/// Configures an [`InstanceRegistry`].
#[derive(Clone, Debug)]
pub struct InstanceRegistryBuilder {
    store: RedisBackend,
    every: Duration,
    live_within: Duration,
    initial: u64,
}

impl InstanceRegistryBuilder {
    /// How often this instance beats (default 1 s).
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(10));
        self
    }

    /// How recent a beat must be for an instance to count as live (default 3 s).
    pub fn live_within(mut self, window: Duration) -> Self {
        self.live_within = window.max(Duration::from_millis(10));
        self
    }

    /// The count to use until the first heartbeat answers (default 1).
    pub fn initial_count(mut self, count: u64) -> Self {
        self.initial = count.max(1);
        self
    }

    /// Starts beating in the background. Must run inside a Tokio runtime.
    pub fn start(self) -> InstanceRegistry {
        let id = instance_id();
        let key = format!("{}:instances", self.store.prefix());
        let count = Arc::new(AtomicU64::new(self.initial));
        let heartbeat = tokio::spawn(beat(
            self.store,
            key.clone(),
            id.clone(),
            self.every,
            self.live_within,
            count.clone(),
        ));
        InstanceRegistry {
            shared: Arc::new(Shared {
                count,
                id,
                key,
                heartbeat,
            }),
        }
    }
}

async fn beat(
    store: RedisBackend,
    key: String,
    id: String,
    every: Duration,
    live_within: Duration,
    count: Arc<AtomicU64>,
) {
    let keys = [key.into_bytes()];
    let window_ms = u64::try_from(live_within.as_millis()).unwrap_or(u64::MAX);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reachable = true;
    loop {
        ticks.tick().await;
        let reply = store
            .connection()
            .clone()
            .run::<u64>(
                &HEARTBEAT,
                HEARTBEAT_SCRIPT,
                &keys,
                &(id.as_str(), window_ms),
                store.response_timeout(),
            )
            .await;
        match reply {
            Ok(live) => {
                let previous = count.swap(live.max(1), Ordering::Relaxed);
                if previous != live.max(1) {
                    tracing::info!(registry = %String::from_utf8_lossy(&keys[0]), live, "live instance count changed");
                }
                metrics::gauge!("tollgate_live_instances", "registry" => String::from_utf8_lossy(&keys[0]).into_owned())
                    .set(live as f64);
                reachable = true;
            }
            // Keep the last known count through the outage.
            Err(error) if reachable => {
                tracing::warn!(%error, "instance heartbeat failed; keeping the last known count");
                reachable = false;
            }
            Err(_) => {}
        }
    }
}

/// A random id for this instance: process id and a random number, unique enough that two
/// instances never share one.
fn instance_id() -> String {
    let random =
        std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    format!("{}-{random:016x}", std::process::id())
}
