//! What a limiter that leases quota is configured with.

use std::time::Duration;

use crate::limiter::instances::InstanceCount;

const DEFAULT_THRESHOLD_PER_SEC: u64 = 100;
const DEFAULT_PERIOD: Duration = Duration::from_millis(100);
const DEFAULT_MAX_CALLERS: usize = 100_000;

/// Leased quota for hot callers, for
/// [`LimiterBuilder::leases`](crate::LimiterBuilder::leases).
///
/// A caller whose rate on this instance reaches the threshold has its decisions made here,
/// from a lease of units taken from the shared store in one call and consumed there at
/// once, so the instances together never exceed a limit. A lease holds about one period of
/// the caller's observed rate, at most its quota divided by the live instance count (so no
/// instance starves the others), and ends after the period or at the end of the sliding
/// window it was counted in, whichever comes first; units left then go back to the store.
/// Callers under the threshold are decided by the store request by request.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{InstanceCount, Leases};
///
/// let leases = Leases::new()
///     .threshold_per_sec(200)
///     .period(Duration::from_millis(100))
///     .instances(InstanceCount::fixed(4));
/// assert_eq!(leases.threshold(), 200);
/// assert_eq!(leases.lease_period(), Duration::from_millis(100));
/// ```
#[derive(Clone, Debug)]
pub struct Leases {
    threshold_per_sec: u64,
    period: Duration,
    instances: InstanceCount,
    max_callers: usize,
}

impl Default for Leases {
    fn default() -> Self {
        Self::new()
    }
}

impl Leases {
    /// Leases for callers at 100 units/s or more on this instance, for 100 ms at a time,
    /// among 1 instance (set [`instances`](Self::instances) when there are more).
    pub fn new() -> Self {
        Self {
            threshold_per_sec: DEFAULT_THRESHOLD_PER_SEC,
            period: DEFAULT_PERIOD,
            instances: InstanceCount::fixed(1),
            max_callers: DEFAULT_MAX_CALLERS,
        }
    }

    /// Leases for callers whose rate on this instance reaches `units_per_sec` (at least 1).
    pub fn threshold_per_sec(mut self, units_per_sec: u64) -> Self {
        self.threshold_per_sec = units_per_sec.max(1);
        self
    }

    /// How long a lease lasts at most, and so how much of the caller's rate it holds
    /// (default 100 ms, at least 1 ms). Longer leases save more round trips and lend a
    /// hot instance more of the quota for longer.
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period.max(Duration::from_millis(1));
        self
    }

    /// How many instances share the limit: a lease holds at most the quota divided by it
    /// (default 1). Give it the Redis instance registry to follow scaling.
    pub fn instances(mut self, instances: InstanceCount) -> Self {
        self.instances = instances;
        self
    }

    /// Tracks the rate of at most `callers` callers (default 100,000); callers beyond are
    /// decided by the store request by request.
    pub fn max_callers(mut self, callers: usize) -> Self {
        self.max_callers = callers;
        self
    }

    /// The rate, in units per second, from which a caller is leased.
    pub fn threshold(&self) -> u64 {
        self.threshold_per_sec
    }

    /// The longest a lease lasts.
    pub fn lease_period(&self) -> Duration {
        self.period
    }

    pub(crate) fn period_ms(&self) -> u64 {
        u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn instance_count(&self) -> u64 {
        self.instances.get()
    }

    pub(crate) fn caller_capacity(&self) -> usize {
        self.max_callers
    }
}
