//! A registry of live instances in Redis, kept by heartbeats: the divisor of a local share.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::backend::RedisBackend;
use crate::store::build_error::BuildError;

/// The gauge of live instances, labelled `registry` (the registry's key).
const LIVE_INSTANCES: &str = "tollgate_live_instances";

const HEARTBEAT_SCRIPT: &str = include_str!("../../../lua/heartbeat.lua");
static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| Script::new(HEARTBEAT_SCRIPT));

/// Counts the live instances of a service through heartbeats in Redis.
///
/// Every instance beats into a sorted set, `<prefix>:instances`, once a second (Redis's
/// clock scores the beats); an instance is live if it beat within the last 3 s. Both are
/// set on the store's builder
/// ([`instance_heartbeat`](crate::store::RedisBackendBuilder::instance_heartbeat) and
/// [`instance_live_within`](crate::store::RedisBackendBuilder::instance_live_within)), as
/// this process's membership in the registry. The count is refreshed by a background task,
/// never on the request path; through an outage the last known count is kept, and it is
/// never below 1. The task stops when the last clone of the registry is dropped, and the
/// others stop counting that instance within the liveness window.
///
/// An instance is one process: every registry a process starts beats under the same id
/// (unless its store was given one with
/// [`instance_id`](crate::store::RedisBackendBuilder::instance_id)), so two registries with
/// one prefix in one process (one per limiter, say) count that process once.
///
/// Until its first heartbeat answers, a registry counts the instances it was told to expect
/// (the initial count that [`start`](Self::start) requires): an instance started, or
/// restarted, while Redis is unreachable has never heard from the registry, and with no
/// count given each of them would divide by 1 and admit the whole limit. Give the most
/// instances the deployment runs (an autoscaler's maximum): a count too high only makes
/// each share smaller until Redis answers.
///
/// When Redis loses the registry (a restart or a failover without the data) it is rebuilt
/// by the next beats, one instance at a time, so for up to a liveness window the count is
/// too low. A count that is lower than the one in use is taken only once the rebuilt registry
/// is a whole liveness window old, when every live instance has beaten into it; a higher
/// count is taken at once, since it only makes each instance's share smaller. A low count
/// from a half-rebuilt registry therefore never becomes the last known count of the next
/// outage.
///
/// ```no_run
/// use tollgate::{FailurePolicy, InstanceCount, InstanceRegistry, Limiter, Policy, Quota, RedisBackend};
///
/// # #[tokio::main] async fn main() {
/// let store = RedisBackend::builder("redis://127.0.0.1:6380/").prefix("orders").build().unwrap();
/// // Four instances run: each divides by 4 until the registry answers, then by the count.
/// let registry = InstanceRegistry::start(&store, 4).unwrap();
/// let limiter = Limiter::builder()
///     .name("orders")
///     .backend(store)
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     // While Redis is down, each instance enforces 50 / (live instances).
///     .on_store_failure(FailurePolicy::local_share(InstanceCount::registry(registry)))
///     .build();
/// # drop(limiter); }
/// ```
#[derive(Clone)]
pub struct InstanceRegistry {
    shared: Arc<Shared>,
}

struct Shared {
    count: Arc<AtomicU64>,
    /// This instance's place among the live ones; `u64::MAX` until a heartbeat answers.
    place: Arc<AtomicU64>,
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
    /// Starts counting this instance in `store`'s Redis, under its prefix, with the
    /// membership its builder set (heartbeat, liveness window, instance id), beating in the
    /// background on the current Tokio runtime.
    ///
    /// `initial_count` is the instances the deployment runs, counted until the first
    /// heartbeat answers: required (at least 1), since an instance started while Redis is
    /// unreachable knows no other count. Give the most the deployment runs; a count too high
    /// only makes each share smaller until Redis answers, one too low lets the instances
    /// together admit more than the limit.
    ///
    /// Fails if the store's heartbeat interval is not shorter than its liveness window (each
    /// instance would then count only itself, and a local share would be the whole limit),
    /// if its instance id is not usable, if `initial_count` is 0, or if called outside a
    /// Tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tollgate::{BuildError, InstanceRegistry, RedisBackend};
    ///
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// let registry = InstanceRegistry::start(&store, 4).unwrap();
    /// assert_eq!(registry.live_instances(), 4);
    /// let uncounted = InstanceRegistry::start(&store, 0);
    /// assert!(matches!(uncounted, Err(BuildError::NoInitialCount)));
    ///
    /// let slow = RedisBackend::builder("redis://127.0.0.1:6380/")
    ///     .instance_heartbeat(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap();
    /// let refused = InstanceRegistry::start(&slow, 4);
    /// assert!(matches!(refused, Err(BuildError::HeartbeatNotShorterThanWindow { .. })));
    /// # }
    /// ```
    pub fn start(store: &RedisBackend, initial_count: u64) -> Result<Self, BuildError> {
        let membership = store.membership();
        if membership.heartbeat >= membership.live_within {
            return Err(BuildError::HeartbeatNotShorterThanWindow {
                heartbeat_every: membership.heartbeat,
                live_within: membership.live_within,
            });
        }
        let id = match &membership.id {
            Some(id) if id.is_empty() || id.chars().any(char::is_control) => {
                return Err(BuildError::InvalidInstanceId(id.clone()));
            }
            Some(id) => id.clone(),
            None => PROCESS_INSTANCE_ID.clone(),
        };
        if initial_count == 0 {
            return Err(BuildError::NoInitialCount);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let key = format!("{}:instances", store.prefix());
        // Described at each start, so a recorder installed after an earlier registry gets it.
        metrics::describe_gauge!(
            LIVE_INSTANCES,
            metrics::Unit::Count,
            "Live instances an InstanceRegistry counts and divides a local share by, by \
             registry key; kept through a store outage."
        );
        let count = Arc::new(AtomicU64::new(initial_count));
        let place = Arc::new(AtomicU64::new(u64::MAX));
        let heartbeat = runtime.spawn(beat(
            store.clone(),
            key.clone(),
            id.clone(),
            membership.heartbeat,
            membership.live_within,
            (count.clone(), place.clone()),
        ));
        Ok(InstanceRegistry {
            shared: Arc::new(Shared {
                count,
                place,
                id,
                key,
                heartbeat,
            }),
        })
    }

    /// This instance's id in the registry: the process's id unless its store was given one
    /// ([`instance_id`](crate::store::RedisBackendBuilder::instance_id)).
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The registry's key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The live instances, at least 1: the initial count until the first heartbeat
    /// answers, then the count the latest one read (kept through an outage). Answers at
    /// once, from memory.
    pub fn live_instances(&self) -> u64 {
        self.shared.count.load(Ordering::Relaxed).max(1)
    }

    /// This instance's place (from 0) among the live instances, in the count
    /// [`live_instances`](Self::live_instances) answers; `None` until a heartbeat answers. Every instance sees a
    /// different one below the count: a local share uses it to spread a quota's remainder
    /// and to take turns with a quota below the count.
    pub fn place(&self) -> Option<u64> {
        let place = self.shared.place.load(Ordering::Relaxed);
        (place != u64::MAX).then_some(place)
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

async fn beat(
    store: RedisBackend,
    key: String,
    id: String,
    every: Duration,
    live_within: Duration,
    (count, place): (Arc<AtomicU64>, Arc<AtomicU64>),
) {
    let registry = key.clone();
    let keys = [key.into_bytes()];
    let window_ms = u64::try_from(live_within.as_millis()).unwrap_or(u64::MAX);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reachable = true;
    let mut holding = false;
    loop {
        ticks.tick().await;
        let reply = store
            .connection()
            .clone()
            .run::<(u64, u64, u64)>(
                &HEARTBEAT,
                HEARTBEAT_SCRIPT,
                &keys,
                &(id.as_str(), window_ms),
                store.response_timeout(),
            )
            .await;
        match reply {
            Ok((live, rebuilt_ms_ago, this_place)) => {
                let live = live.max(1);
                let previous = count.load(Ordering::Relaxed);
                match next_count(previous, live, rebuilt_ms_ago, window_ms) {
                    Some(next) => {
                        count.store(next, Ordering::Relaxed);
                        // The place goes with the count it was counted in.
                        place.store(this_place, Ordering::Relaxed);
                        if previous != next {
                            tracing::info!(%registry, live = next, "live instance count changed");
                        }
                        holding = false;
                    }
                    None if !holding => {
                        tracing::info!(
                            %registry,
                            live,
                            kept = previous,
                            "the instance registry is being rebuilt (Redis lost it); keeping the \
                             last trusted count until every instance has beaten into it"
                        );
                        holding = true;
                    }
                    None => {}
                }
                metrics::gauge!(LIVE_INSTANCES, "registry" => registry.clone())
                    .set(count.load(Ordering::Relaxed) as f64);
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

/// The count to use after a heartbeat saw `live` instances in a registry (re)built
/// `rebuilt_ms_ago`, or `None` to keep `current`: a lower count from a registry younger
/// than the liveness window may miss instances that have not beaten into it yet.
fn next_count(current: u64, live: u64, rebuilt_ms_ago: u64, window_ms: u64) -> Option<u64> {
    (live >= current || rebuilt_ms_ago >= window_ms).then_some(live)
}

/// The id every registry in this process beats under, unless given another: one process is
/// one instance.
static PROCESS_INSTANCE_ID: LazyLock<String> = LazyLock::new(instance_id);

/// A random id for this process: process id and a random number, unique enough that two
/// processes never share one (containers often all run as pid 1).
fn instance_id() -> String {
    let random =
        std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    format!("{}-{random:016x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_count_waits_for_a_whole_window_after_a_rebuild() {
        // A settled registry: any count is taken.
        assert_eq!(next_count(5, 3, 60_000, 3_000), Some(3));
        assert_eq!(next_count(3, 5, 60_000, 3_000), Some(5));
        // Rebuilt 1 s ago: a lower count is held back, a higher or equal one taken at once.
        assert_eq!(next_count(5, 1, 1_000, 3_000), None);
        assert_eq!(next_count(5, 4, 2_999, 3_000), None);
        assert_eq!(next_count(5, 6, 1_000, 3_000), Some(6));
        assert_eq!(next_count(5, 5, 0, 3_000), Some(5));
        // A whole window after the rebuild every live instance has beaten: taken.
        assert_eq!(next_count(5, 2, 3_000, 3_000), Some(2));
    }

    #[test]
    fn every_registry_of_a_process_shares_its_id() {
        assert_eq!(*PROCESS_INSTANCE_ID, *PROCESS_INSTANCE_ID);
        assert!(PROCESS_INSTANCE_ID.starts_with(&format!("{}-", std::process::id())));
    }
}
