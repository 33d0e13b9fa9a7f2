//! A live count of the instances sharing a store: what a local share divides by.

use std::fmt;

/// A live count of the instances that share a store, such as a registry of heartbeats.
pub trait LiveInstances: Send + Sync + fmt::Debug + 'static {
    /// The number of live instances, at least 1. Must answer at once (no I/O): a source
    /// that learns the count over the network refreshes it in the background and keeps
    /// the last known value through an outage.
    fn live_instances(&self) -> u64;

    /// This instance's place (from 0) among the live instances, when the source knows it:
    /// every instance must see a different one below the count. A local share uses it to
    /// spread a quota's remainder and to take turns with a quota below the count.
    fn place(&self) -> Option<u64> {
        None
    }
}
