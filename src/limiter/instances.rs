//! How many instances of the service share a limit: the divisor of a local share.

use std::fmt;
use std::sync::Arc;

use crate::store::instances::LiveInstances;

/// The divisor of a local share: fixed, from a closure, or from a [`LiveInstances`] source
/// (such as the Redis instance registry). Never below 1.
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
}

#[derive(Clone)]
enum Source {
    Fixed(u64),
    Fn(Arc<dyn Fn() -> u64 + Send + Sync>),
    Live(Arc<dyn LiveInstances>),
}

impl InstanceCount {
    /// Always `count` instances.
    pub fn fixed(count: u64) -> Self {
        Self {
            source: Source::Fixed(count.max(1)),
        }
    }

    /// Asks `count` each time a share is computed; it must answer at once.
    pub fn from_fn(count: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self {
            source: Source::Fn(Arc::new(count)),
        }
    }

    /// Reads a live source, such as the Redis instance registry.
    pub fn live(source: impl LiveInstances) -> Self {
        Self {
            source: Source::Live(Arc::new(source)),
        }
    }

    /// The current count, at least 1.
    pub fn get(&self) -> u64 {
        match &self.source {
            Source::Fixed(count) => *count,
            Source::Fn(count) => count().max(1),
            Source::Live(source) => source.live_instances().max(1),
        }
    }
}

impl fmt::Debug for InstanceCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Fixed(count) => f.debug_tuple("InstanceCount::fixed").field(count).finish(),
            Source::Fn(_) => f.write_str("InstanceCount::from_fn(..)"),
            Source::Live(source) => f.debug_tuple("InstanceCount::live").field(source).finish(),
        }
    }
}
