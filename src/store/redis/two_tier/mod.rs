//! One limit across regions: a store in each region's Redis that decides every request
//! against units it has leased of the caller's global quota from a global store, one WAN
//! round trip away, and leases more in the background, ahead of the region's demand.

mod regional;
mod wan;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::backend::RedisBackend;
use crate::store::algorithm::Algorithm;
use crate::store::backend::{Backend, CheckOutcome, StoreError};
use crate::store::build_error::BuildError;
use crate::store::caller::CallerKey;
use crate::store::domain::FailureDomain;
use crate::store::future::StoreFuture;
use crate::store::policy::Policy;

/// A region's store in a deployment that keeps one limit across regions.
///
/// Each region runs its own Redis, and its instances decide on it: one regional round trip
/// per request, as with a [`RedisBackend`]. What a region admits are units it has leased of
/// the caller's quota from the global store (a [`RedisBackend`] on a Redis or a Cluster of
/// its own), which counts them at once. A lease is sized by the caller's demand in the
/// region over the last second (a round trip and a
/// [horizon](TwoTierBuilder::lease_horizon) of it), taken by one instance of the region at
/// a time, in the background, in one call that also gives back what the region did not
/// spend. A unit spent after the window it was counted in has ended (a caller whose
/// requests are further apart than a lease's life would otherwise find it gone every time)
/// is counted again in the window it was spent in, with the region's next call, and
/// taken back from its own; a window later it goes back unspent. The global store keeps
/// room in each window for the units of the previous one that any region may still hold,
/// as far as its last call told: while every region reaches it, the regions together
/// never admit more than the limit in any of its windows. A lease that comes back empty
/// to a region that holds nothing is asked again half a horizon later, a few times.
///
/// A WAN call that gets no answer within the [timeout](TwoTierBuilder::wan_timeout) cuts
/// the region off: it spends the units it holds while their window lasts, then admits up
/// to its share of the limit (its part of the regions' demand, or of their
/// [weights](TwoTierBuilder::share_by_weight)), started as the limiter's local share starts
/// (from its part of the count the global store last gave, with the room it had then), and
/// tries the global store again every [probe](TwoTierBuilder::probe_every). The global
/// store, which cannot tell a region cut off from one that has not called yet, grants a
/// lease only as far as it leaves room for any one other region's share: through one
/// region's partition the regions together still keep the limit. Once a lease comes back,
/// it pays first for what the share admitted meanwhile, and the rest is counted with the
/// next call. When the region's own Redis fails, the limiter's
/// [`FailurePolicy`](crate::FailurePolicy) applies, as for any store.
///
/// It decides callers with one sliding window policy (the limiter's others, or a token
/// bucket, are refused as a store error, which the failure policy answers). A new
/// caller's first requests in a region are refused until its first lease is back, a round
/// trip later; a refusal says to retry a round trip later. It neither refunds nor charges
/// after the fact (a layer's `count_only` or `settle` meets a store error there). The
/// limiter keeps no denial cache in front of it ([`Backend::refusals_hold`]). The guide's page on
/// [regions](crate::guide::regions) says when to use it, what it guarantees and what it
/// costs.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{Limiter, Policy, Quota, RedisBackend};
/// use tollgate::store::TwoTierBackend;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let regional = RedisBackend::builder("redis://redis.us-east.internal:6379/").build()?;
/// let global = RedisBackend::builder("redis://redis.global.internal:6379/").build()?;
/// let store = TwoTierBackend::builder("us-east", regional, global)
///     .wan_rtt(Duration::from_millis(80))
///     .build()?;
/// let limiter = Limiter::builder()
///     .name("orders")
///     .backend(store)
///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(10_000)))
///     .try_build()?;
/// # drop(limiter);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TwoTierBackend {
    inner: Arc<TwoTier>,
}

#[derive(Debug)]
struct TwoTier {
    region: String,
    regional: RedisBackend,
    global: RedisBackend,
    /// This region's weight and all regions' together, for shares by weight; `None` for
    /// shares by demand.
    weights: Option<(u32, u32)>,
    wan_timeout: Duration,
    /// The settings the regional script reads, in whole milliseconds, made once here: the
    /// lease horizon, the probe interval while cut off, and how long a refill's claim
    /// lasts (longer than the wait for the global connection, the call and the write
    /// back, so that one instance of the region calls for a caller at a time).
    horizon_ms: u64,
    probe_ms: u64,
    claim_ms: u64,
    /// The WAN round trip, in microseconds: the configured one, then a moving average of
    /// the calls that were answered.
    rtt_us: AtomicU64,
    /// WAN calls made from this instance.
    calls: AtomicU64,
    /// The same, by outcome, for the metrics recorder in force when the store was built.
    outcomes: wan::Outcomes,
}

/// Builds a [`TwoTierBackend`]; from [`TwoTierBackend::builder`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::RedisBackend;
/// use tollgate::store::TwoTierBackend;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let regional = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
/// let global = RedisBackend::builder("redis://127.0.0.1:6381/").build().unwrap();
/// let store = TwoTierBackend::builder("eu-west", regional, global)
///     .wan_rtt(Duration::from_millis(120))
///     .wan_timeout(Duration::from_millis(500))
///     .lease_horizon(Duration::from_millis(300))
///     .probe_every(Duration::from_secs(2))
///     .share_by_weight(1, 3)
///     .build()
///     .unwrap();
/// assert_eq!(store.wan_calls(), 0);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TwoTierBuilder {
    region: String,
    regional: RedisBackend,
    global: RedisBackend,
    weights: Option<(u32, u32)>,
    wan_rtt: Duration,
    wan_timeout: Option<Duration>,
    horizon: Duration,
    probe: Duration,
}

impl TwoTierBackend {
    /// The store of the region named `region` (the same name on each of its instances,
    /// another in each region), on `regional`, the Redis of the region, leasing from
    /// `global`. Defaults: a WAN round trip of 100 ms until one is measured, a timeout of
    /// three round trips, a horizon of 200 ms, a probe a second, and shares by demand.
    ///
    /// ```
    /// use tollgate::RedisBackend;
    /// use tollgate::store::TwoTierBackend;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let regional = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// let global = RedisBackend::builder("redis://127.0.0.1:6381/").build().unwrap();
    /// let store = TwoTierBackend::builder("us-east", regional, global).build();
    /// assert!(store.is_ok());
    /// # }
    /// ```
    pub fn builder(
        region: impl Into<String>,
        regional: RedisBackend,
        global: RedisBackend,
    ) -> TwoTierBuilder {
        TwoTierBuilder {
            region: region.into(),
            regional,
            global,
            weights: None,
            wan_rtt: Duration::from_millis(100),
            wan_timeout: None,
            horizon: Duration::from_millis(200),
            probe: Duration::from_secs(1),
        }
    }

    /// How many calls to the global store this instance has made: divided by the requests
    /// it decided, the WAN calls per request.
    ///
    /// ```
    /// use tollgate::RedisBackend;
    /// use tollgate::store::TwoTierBackend;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let regional = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// let global = RedisBackend::builder("redis://127.0.0.1:6381/").build().unwrap();
    /// let store = TwoTierBackend::builder("us-east", regional, global).build().unwrap();
    /// assert_eq!(store.wan_calls(), 0);
    /// # }
    /// ```
    pub fn wan_calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }
}

impl TwoTierBuilder {
    /// The WAN round trip to expect until calls measure it (default 100 ms).
    pub fn wan_rtt(mut self, rtt: Duration) -> Self {
        self.wan_rtt = rtt;
        self
    }

    /// How long a call to the global store may take before the region counts itself cut
    /// off (default three of [`wan_rtt`](Self::wan_rtt)).
    pub fn wan_timeout(mut self, timeout: Duration) -> Self {
        self.wan_timeout = Some(timeout);
        self
    }

    /// How much of the demand beyond one round trip a lease covers (default 200 ms): longer
    /// means fewer WAN calls, and more units held by a region that another might have had.
    pub fn lease_horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// How often a region cut off tries the global store again (default 1 s).
    pub fn probe_every(mut self, probe: Duration) -> Self {
        self.probe = probe;
        self
    }

    /// This region's share of the limit while it is cut off: `weight` of `all` (every
    /// region's weight together), rounded down, for every caller. By default a region's
    /// share is its part of the caller's demand over all regions, as each last reported
    /// it: shares follow the traffic, and a region that never asked for a caller has none
    /// of it. Weights keep each region's part in reserve for every caller, whether it asks
    /// or not, which the other regions then cannot lease. Give every region its weight,
    /// the weights adding up to `all`.
    pub fn share_by_weight(mut self, weight: u32, all: u32) -> Self {
        self.weights = Some((weight, all));
        self
    }

    /// The store.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidRegion`] when the weights' `all` is 0 or below the region's
    /// weight, or the region's name is empty or holds a control character.
    pub fn build(self) -> Result<TwoTierBackend, BuildError> {
        if let Some((weight, all)) = self.weights
            && (all == 0 || weight > all)
        {
            return Err(BuildError::InvalidRegion {
                region: self.region,
                weight,
                all,
            });
        }
        if self.region.is_empty() || self.region.chars().any(char::is_control) {
            return Err(BuildError::InvalidRegion {
                region: self.region,
                weight: 0,
                all: 0,
            });
        }
        let rtt_us = u64::try_from(self.wan_rtt.as_micros()).unwrap_or(u64::MAX);
        let wan_timeout = self.wan_timeout.unwrap_or(self.wan_rtt * 3);
        let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let claim = self.global.connect_timeout() + wan_timeout + self.regional.response_timeout();
        let outcomes = wan::Outcomes::new(&self.region);
        Ok(TwoTierBackend {
            inner: Arc::new(TwoTier {
                region: self.region,
                regional: self.regional,
                global: self.global,
                weights: self.weights,
                wan_timeout,
                horizon_ms: millis(self.horizon),
                probe_ms: millis(self.probe),
                claim_ms: millis(claim).max(1),
                rtt_us: AtomicU64::new(rtt_us),
                calls: AtomicU64::new(0),
                outcomes,
            }),
        })
    }
}

impl TwoTier {
    /// The WAN round trip as measured so far, in whole milliseconds (at least 1).
    fn rtt_ms(&self) -> u64 {
        (self.rtt_us.load(Ordering::Relaxed) / 1_000).max(1)
    }

    /// Folds one answered call's round trip into the estimate (an eighth of it).
    fn measured(&self, rtt: Duration) {
        let sample = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX);
        let old = self.rtt_us.load(Ordering::Relaxed);
        let new = old - old / 8 + sample / 8;
        self.rtt_us.store(new, Ordering::Relaxed);
    }

    /// The region's share of `limit` when cut off without ever having heard from the
    /// global store: its weight's part, or by demand nothing.
    fn share_of(&self, limit: u64) -> u64 {
        let Some((weight, all)) = self.weights else {
            return 0;
        };
        u64::try_from(u128::from(limit) * u128::from(weight) / u128::from(all.max(1)))
            .unwrap_or(limit)
    }
}

/// A caller's record of the two-tier store in `store`: `<prefix>:{<caller>}:<policy><suffix>`,
/// beside the caller's other keys (`:regional` in the region's Redis, `:two-tier` in the
/// global one).
fn record_key(
    store: &RedisBackend,
    caller: &CallerKey,
    limits: &[Policy],
    suffix: &[u8],
) -> Vec<u8> {
    let name = limits.first().map_or("", Policy::name);
    let mut key_suffix = Vec::with_capacity(name.len() + suffix.len());
    key_suffix.extend_from_slice(name.as_bytes());
    key_suffix.extend_from_slice(suffix);
    store.tagged_key(caller, &key_suffix)
}

/// The limit and window of the one sliding window policy a two-tier store decides.
fn sliding_window(limits: &[Policy]) -> Result<(u64, u64), StoreError> {
    match limits {
        [policy] => match policy.algorithm() {
            &Algorithm::SlidingWindow { limit, window_ms } => Ok((limit, window_ms)),
            _ => Err(StoreError::other(
                "the two-tier store decides a sliding window policy only",
            )),
        },
        _ => Err(StoreError::other(
            "the two-tier store decides one policy per caller",
        )),
    }
}

impl Backend for TwoTierBackend {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let (limit, window_ms) = match sliding_window(limits) {
            Ok(policy) => policy,
            Err(error) => return StoreFuture::ready(Err(error)),
        };
        let inner = Arc::clone(&self.inner);
        let (caller, limits) = (caller.clone(), Arc::clone(limits));
        StoreFuture::boxed(async move {
            let decided =
                regional::decide(&inner, &caller, &limits, cost, limit, window_ms).await?;
            if let Some(refill) = decided.refill {
                inner.calls.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(wan::call(inner, caller, limits, refill));
            }
            Ok(decided.outcome)
        })
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn refusals_hold(&self) -> bool {
        false
    }

    fn failure_domain(&self, caller: &CallerKey) -> FailureDomain {
        self.inner.regional.failure_domain(caller)
    }

    fn failure_domain_label(&self, id: u32) -> Option<String> {
        self.inner.regional.failure_domain_label(id)
    }
}
