//! Named quotas and the algorithm each one counts with.

use std::sync::Arc;
use std::time::Duration;

use crate::limiter::builder::BuildError;
use crate::store::algorithm::{Algorithm, Limit};

/// A number of requests over a span of time, read the way people say it:
/// `Quota::per_second(50)` is 50 requests in one second.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let quota = Quota::per_second(50);
/// assert_eq!(quota.count(), 50);
/// assert_eq!(quota.period(), Duration::from_secs(1));
/// assert_eq!(Quota::per_day(1_000_000).period(), Duration::from_secs(86_400));
/// assert_eq!(Quota::new(5, Duration::from_secs(60)), Quota::per_minute(5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    count: u64,
    period: Duration,
}

impl Quota {
    /// `count` requests in every `period`.
    pub const fn new(count: u64, period: Duration) -> Self {
        Self { count, period }
    }

    /// `count` requests per second.
    pub const fn per_second(count: u64) -> Self {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` requests per minute.
    pub const fn per_minute(count: u64) -> Self {
        Self::new(count, Duration::from_secs(60))
    }

    /// `count` requests per hour.
    pub const fn per_hour(count: u64) -> Self {
        Self::new(count, Duration::from_secs(3_600))
    }

    /// `count` requests per day (86,400 s).
    pub const fn per_day(count: u64) -> Self {
        Self::new(count, Duration::from_secs(86_400))
    }

    /// How many requests.
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// Over how long.
    pub const fn period(&self) -> Duration {
        self.period
    }
}

/// A named quota with its algorithm: one item of `RateLimit-Policy`.
///
/// The name is what clients see in the headers and the problem body (`"per-second"`), so
/// it must be 1 to 64 printable ASCII characters; the constructors panic otherwise, as
/// they do for a zero quota or period.
///
/// ```
/// use tollgate::{Policy, Quota};
///
/// // 50 requests in any one second.
/// let per_second = Policy::sliding_window("per-second", Quota::per_second(50));
/// // 1,000,000 a day.
/// let per_day = Policy::sliding_window("per-day", Quota::per_day(1_000_000));
/// // 10 a second on average, with bursts of up to 30.
/// let smooth = Policy::token_bucket("smooth", Quota::per_second(10), 30);
/// assert_eq!(per_second.name(), "per-second");
/// assert_eq!(per_day.quota(), 1_000_000);
/// assert_eq!(smooth.quota(), 30);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    limit: Limit,
}

impl Policy {
    /// Counts with the sliding window counter: `quota.count()` requests in any window of
    /// `quota.period()`, the previous fixed window weighted by its remaining overlap.
    ///
    /// # Panics
    ///
    /// On an invalid name, a zero count, a period under 1 ms, or count x period (ms) of
    /// 2^53 or more.
    pub fn sliding_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self {
            limit: Limit::new(name, Algorithm::sliding_window(quota.count, quota.period)),
        }
    }

    /// Counts with a token bucket refilled at `rate` (`Quota::per_second(10)`: ten tokens a
    /// second) that holds at most `burst` tokens.
    ///
    /// # Panics
    ///
    /// On an invalid name, a zero rate or burst, or a period under 1 ms.
    pub fn token_bucket(name: impl Into<Arc<str>>, rate: Quota, burst: u64) -> Self {
        Self {
            limit: Limit::new(
                name,
                Algorithm::token_bucket(rate.count, rate.period, burst),
            ),
        }
    }

    /// A policy from a store-level [`Limit`].
    pub fn from_limit(limit: Limit) -> Self {
        Self { limit }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        self.limit.name()
    }

    /// The quota advertised as `q`.
    pub fn quota(&self) -> u64 {
        self.limit.algorithm().quota()
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &Algorithm {
        self.limit.algorithm()
    }

    /// The store-level form.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }
}

impl From<Policy> for Limit {
    fn from(policy: Policy) -> Self {
        policy.limit
    }
}

/// One set of policies a caller is decided against (the defaults, or a tier's), with an
/// identity that changes whenever any of its policies does: a refusal is remembered for
/// the set that refused, so a caller moved to another tier is asked about afresh.
#[derive(Clone, Debug)]
pub(crate) struct PolicySet {
    pub(crate) limits: Arc<[Limit]>,
    pub(crate) id: u64,
}

impl PolicySet {
    pub(crate) fn new(
        tier: Option<&Arc<str>>,
        limits: &[Limit],
        scope: &Arc<str>,
    ) -> Result<Self, BuildError> {
        let tier_name = || tier.map(|t| t.to_string());
        if limits.is_empty() {
            return Err(BuildError::NoPolicies { tier: tier_name() });
        }
        for (i, limit) in limits.iter().enumerate() {
            if limits[..i].iter().any(|other| other.name() == limit.name()) {
                return Err(BuildError::DuplicatePolicy {
                    tier: tier_name(),
                    name: limit.name().to_owned(),
                });
            }
        }
        let limits: Arc<[Limit]> = limits.iter().map(|limit| limit.scoped(scope)).collect();
        // Within one process only: the cache that reads it is local.
        let id = std::hash::BuildHasher::hash_one(
            &std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default(),
            &*limits,
        );
        Ok(Self { limits, id })
    }
}
