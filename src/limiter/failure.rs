//! What a limiter does when its store cannot decide: the policy chosen per route, and its
//! execution ([`Fallback`]), with the local share's own counters.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::limiter::decision::{
    Decision, DecisionSource, FallbackReason, RateLimitInfo, Receipt, UnlimitedReason,
    whole_seconds,
};
use crate::limiter::denial_cache::DenialCache;
use crate::limiter::instances::InstanceCount;
use crate::limiter::policy_set::PolicySet;
use crate::limiter::telemetry::FallbackCounters;
use crate::store::backend::{Backend, Refund, StoreError, StoreErrorKind};
use crate::store::caller::Caller;
use crate::store::clock::Clock;
use crate::store::memory::InMemoryBackend;
use crate::store::policy::Policy;

/// The choice made for a route when the store is slow or down.
///
/// | policy | during an outage | for |
/// |---|---|---|
/// | [`open`](Self::open) | everything passes, uncounted | routes where availability beats the limit |
/// | [`closed`](Self::closed) | 503 + Retry-After (never 500) | credentials, one-time codes, password-reset mails, hard spend limits |
/// | [`local_share`](Self::local_share) | each instance enforces the limit divided by the live instance count | most API routes: fairness between customers |
/// | [`fail_static`](Self::fail_static) | cached refusals keep refusing until they expire, the rest passes | long quotas (per day) |
/// | [`static_then`](Self::static_then) | cached refusals first, then another policy for the rest | long quotas with a local share |
///
/// ```
/// use tollgate::{FailurePolicy, InstanceCount};
///
/// let orders = FailurePolicy::local_share(InstanceCount::fixed(4));
/// let login = FailurePolicy::closed();
/// let daily = FailurePolicy::static_then(FailurePolicy::local_share(InstanceCount::fixed(4)));
/// # drop((orders, login, daily));
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through uncounted.
    #[default]
    Open,
    /// Refuse (503 by default, never 500; see
    /// [`RateLimitLayer::unavailable_status`](crate::RateLimitLayer::unavailable_status))
    /// with a Retry-After of the breaker's remaining open time (at least 1 s).
    Closed,
    /// Enforce every policy's quota divided by the live instance count, with an in-process
    /// counter of the same algorithm; the headers advertise the share.
    LocalShare(InstanceCount),
    /// Keep refusing callers whose refusal is cached until it expires; let the rest pass.
    Static,
    /// Cached refusals first, then the inner policy for everybody else.
    StaticThen(Box<FailurePolicy>),
}

impl FailurePolicy {
    /// Fail open: allow.
    pub fn open() -> Self {
        FailurePolicy::Open
    }

    /// Fail closed: refuse with 503 and Retry-After. The layer answers with the status
    /// of [`RateLimitLayer::unavailable_status`](crate::RateLimitLayer::unavailable_status)
    /// (503 unless set).
    pub fn closed() -> Self {
        FailurePolicy::Closed
    }

    /// Enforce a local share of the limit: quota / `instances`. The shares together never
    /// exceed the limit, whatever the quota and the count; a quota smaller than the count
    /// stretches each share's window (see [`Algorithm::divided_by`](crate::store::Algorithm::divided_by)).
    pub fn local_share(instances: InstanceCount) -> Self {
        FailurePolicy::LocalShare(instances)
    }

    /// Fail static: cached refusals keep refusing, everything else passes.
    pub fn fail_static() -> Self {
        FailurePolicy::Static
    }

    /// Cached refusals first, then `rest` for everybody else.
    pub fn static_then(rest: FailurePolicy) -> Self {
        FailurePolicy::StaticThen(Box::new(rest))
    }

    /// A short, stable name for logs and metric labels.
    ///
    /// ```
    /// assert_eq!(tollgate::FailurePolicy::closed().as_str(), "closed");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::LocalShare(_) => "local_share",
            FailurePolicy::Static => "static",
            FailurePolicy::StaticThen(rest) => match **rest {
                FailurePolicy::Open => "static_then_open",
                FailurePolicy::Closed => "static_then_closed",
                FailurePolicy::LocalShare(_) => "static_then_local_share",
                _ => "static_then_static",
            },
        }
    }
}

/// Why and where a store could not decide, with what the failure policy reads there.
pub(super) struct Failure<'a> {
    pub(super) reason: FallbackReason,
    /// The fallback counters of the part of the store that failed.
    pub(super) counters: &'a FallbackCounters,
    /// How long that part's breaker stays open (0 when there is none): a closed route's
    /// Retry-After.
    pub(super) open_for_ms: u64,
    /// Refusals known from the store, which a static policy keeps serving.
    pub(super) denials: Option<&'a DenialCache>,
    /// The limiter's time, when already read.
    pub(super) now: Option<u64>,
}

/// A policy set, a divisor, and the set divided by it.
type Share = (Arc<[Policy]>, u64, Arc<[Policy]>);

/// The failure policy in execution: the policy, and a local share's own counters with
/// the divided policy sets they count against.
pub(super) struct Fallback {
    policy: FailurePolicy,
    clock: Arc<dyn Clock>,
    /// Counters of the local share, kept apart from the store's.
    local: InMemoryBackend,
    /// Divided policy sets by (original set, divisor), so a share costs no allocation per
    /// request.
    shares: ArcSwap<Vec<Share>>,
}

impl Fallback {
    /// `policy`, its local share counting on `clock`.
    pub(super) fn new(policy: FailurePolicy, clock: Arc<dyn Clock>) -> Self {
        let local = InMemoryBackend::builder()
            .clock(SharedClock(clock.clone()))
            .build();
        Self {
            policy,
            clock,
            local,
            shares: ArcSwap::default(),
        }
    }

    /// The policy executed.
    pub(super) fn policy(&self) -> &FailurePolicy {
        &self.policy
    }

    /// Counts the failure, and decides the request by the failure policy.
    pub(super) fn decide(
        &self,
        failure: &Failure<'_>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
    ) -> Decision {
        failure.counters.count(failure.reason);
        self.apply(&self.policy, failure, caller, set, cost)
    }

    fn apply(
        &self,
        policy: &FailurePolicy,
        failure: &Failure<'_>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
    ) -> Decision {
        let limits = &set.limits;
        match policy {
            FailurePolicy::Open => Decision::Unlimited(UnlimitedReason::StoreFailedOpen),
            FailurePolicy::Closed => Decision::Unavailable {
                retry_after_secs: whole_seconds(failure.open_for_ms),
                policies: limits.clone(),
            },
            FailurePolicy::LocalShare(instances) => {
                self.with_share(limits, instances.get(), |share| {
                    self.decide_share(caller, set, share, cost, failure.now)
                })
            }
            FailurePolicy::Static => self
                .cached_refusal(failure.denials, caller, set, cost)
                .unwrap_or(Decision::Unlimited(UnlimitedReason::StoreFailedOpen)),
            FailurePolicy::StaticThen(rest) => self
                .cached_refusal(failure.denials, caller, set, cost)
                .unwrap_or_else(|| self.apply(rest, failure, caller, set, cost)),
        }
    }

    /// Gives back what a request admitted by the local share consumed, to the local
    /// counters that counted it.
    pub(super) fn refund(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> Result<(), StoreError> {
        self.local
            .refund(caller.key(), limits, refund)
            .try_take_ready()
            .unwrap_or_else(|| Err(StoreError::new(StoreErrorKind::Other, "pending")))
    }

    /// A refusal the store made that still holds, for a request of `cost` or more.
    fn cached_refusal(
        &self,
        denials: Option<&DenialCache>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
    ) -> Option<Decision> {
        denials?
            .covering(caller.key(), set.id, self.clock.now_millis(), cost)
            .map(Decision::Limited)
    }

    /// Decides a request of `cost` units on this instance's own counters of `share`.
    fn decide_share(
        &self,
        caller: &Caller,
        set: &PolicySet,
        share: &Arc<[Policy]>,
        cost: u64,
        now: Option<u64>,
    ) -> Decision {
        // The local counters run on the limiter's clock: a time just read serves them too.
        let now = now.unwrap_or_else(|| self.clock.now_millis());
        let outcome = self.local.decide_at(caller.key(), share, cost, now);
        let info =
            RateLimitInfo::from_outcomes(share, outcome.limits(), DecisionSource::LocalShare)
                .for_cost(cost);
        if outcome.admitted() {
            // The local counters took it: a refund goes back to them.
            Decision::Allowed(info.with_receipt(Receipt {
                counted_at_ms: outcome.counted_at_ms(),
                set_id: set.id,
            }))
        } else {
            Decision::Limited(info)
        }
    }

    /// Runs `decide` on `limits` divided by `divisor`, computed once per set and divisor:
    /// later requests find it in a snapshot read without a lock, and borrow it from there.
    fn with_share<T>(
        &self,
        limits: &Arc<[Policy]>,
        divisor: u64,
        decide: impl FnOnce(&Arc<[Policy]>) -> T,
    ) -> T {
        let position = |shares: &[Share]| {
            shares
                .iter()
                .position(|(original, n, _)| Arc::ptr_eq(original, limits) && *n == divisor)
        };
        let known = self.shares.load();
        if let Some(i) = position(&known) {
            return decide(&known[i].2);
        }
        drop(known);
        let find = |shares: &[Share]| position(shares).map(|i| shares[i].2.clone());
        let share: Arc<[Policy]> = limits
            .iter()
            .map(|limit| limit.with_algorithm(limit.algorithm().divided_by(divisor)))
            .collect();
        // Two requests may divide the same set at once: the first stored wins, so every
        // request decides against one allocation (the local counters are keyed by the
        // policies' contents, so either would count the same).
        let mut stored = share.clone();
        self.shares.rcu(|shares| {
            if let Some(existing) = find(shares) {
                stored = existing;
                return Vec::clone(shares);
            }
            stored = share.clone();
            let mut shares = Vec::clone(shares);
            // A handful of sets times the divisors seen; keep the newest few.
            if shares.len() >= 64 {
                shares.remove(0);
            }
            shares.push((limits.clone(), divisor, share.clone()));
            shares
        });
        decide(&stored)
    }
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The limiter's clock, shared with the local share's counters.
#[derive(Debug)]
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }
}
