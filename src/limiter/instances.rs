//! How many instances of the service share a limit: the divisor of a local share.

use std::fmt;
use std::sync::Arc;

#[cfg(feature = "redis")]
use crate::store::redis::registry::InstanceRegistry;

/// The divisor of a local share: fixed, from a closure, or (with the `redis` feature) from
/// the Redis instance registry. Never below 1.
///
/// ```
/// use tollgate::InstanceCount;
///
/// assert_eq!(InstanceCount::fixed(4).get(), 4);
/// assert_eq!(InstanceCount::fixed(0).get(), 1);
/// let from_env = InstanceCount::from_fn(|| {
///     std::env::var("REPLICAS").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
/// });
/// assert!(from_env.get() >= 1);
/// ```
#[derive(Clone)]
pub struct InstanceCount {
    source: Source,
    /// This instance's place among the instances, when the deployment says.
    place: Option<u64>,
}

#[derive(Clone)]
enum Source {
    Fixed(u64),
    Fn(Arc<dyn Fn() -> u64 + Send + Sync>),
    #[cfg(feature = "redis")]
    Registry(InstanceRegistry),
}

impl InstanceCount {
    /// Always `count` instances.
    pub fn fixed(count: u64) -> Self {
        Self {
            source: Source::Fixed(count.max(1)),
            place: None,
        }
    }

    /// Asks `count` each time a share is computed; it must answer at once.
    pub fn from_fn(count: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self {
            source: Source::Fn(Arc::new(count)),
            place: None,
        }
    }

    /// The live instances `registry` counts, read each time a share is computed (the
    /// registry refreshes its count in the background), and this instance's place among
    /// them once a heartbeat has told it. The same as `InstanceCount::from(registry)`.
    ///
    /// ```no_run
    /// use tollgate::{FailurePolicy, InstanceCount, InstanceRegistry, RedisBackend};
    ///
    /// # #[tokio::main] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/").prefix("orders").build().unwrap();
    /// let registry = InstanceRegistry::start(&store, 4).unwrap();
    /// let failure = FailurePolicy::local_share(InstanceCount::registry(registry));
    /// # drop(failure); }
    /// ```
    #[cfg(feature = "redis")]
    pub fn registry(registry: InstanceRegistry) -> Self {
        Self {
            source: Source::Registry(registry),
            place: None,
        }
    }

    /// This instance is the one at `place` (from 0) among the instances, such as a
    /// StatefulSet's ordinal: the shares of a quota that does not divide evenly then sum to
    /// the quota exactly, and a quota below the instance count is taken in turns that never
    /// meet (see [`FailurePolicy::local_share`](crate::FailurePolicy::local_share)). Each
    /// instance must be given a different place below the count; a place at or beyond it
    /// wraps around. A count from the Redis instance registry (`InstanceCount::registry`,
    /// the `redis` feature) knows the places and needs none.
    ///
    /// ```
    /// use tollgate::InstanceCount;
    ///
    /// let third_of_four = InstanceCount::fixed(4).at_place(2);
    /// assert_eq!(third_of_four.get(), 4);
    /// ```
    pub fn at_place(mut self, place: u64) -> Self {
        self.place = Some(place);
        self
    }

    /// This instance's place among the instances, if known: given, or from the registry.
    pub(crate) fn place(&self) -> Option<u64> {
        match &self.source {
            _ if self.place.is_some() => self.place,
            #[cfg(feature = "redis")]
            Source::Registry(registry) => registry.place(),
            _ => None,
        }
    }

    /// The current count, at least 1.
    pub fn get(&self) -> u64 {
        match &self.source {
            Source::Fixed(count) => *count,
            Source::Fn(count) => count().max(1),
            #[cfg(feature = "redis")]
            Source::Registry(registry) => registry.live_instances(),
        }
    }
}

#[cfg(feature = "redis")]
impl From<InstanceRegistry> for InstanceCount {
    /// [`InstanceCount::registry`].
    fn from(registry: InstanceRegistry) -> Self {
        Self::registry(registry)
    }
}

impl fmt::Debug for InstanceCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Fixed(count) => f.debug_tuple("InstanceCount::fixed").field(count).finish(),
            Source::Fn(_) => f.write_str("InstanceCount::from_fn(..)"),
            #[cfg(feature = "redis")]
            Source::Registry(registry) => f
                .debug_tuple("InstanceCount::registry")
                .field(registry)
                .finish(),
        }?;
        match self.place {
            Some(place) => write!(f, ".at_place({place})"),
            None => Ok(()),
        }
    }
}
