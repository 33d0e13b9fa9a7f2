//! When the store cannot decide: why (the reason counted), and executing the route's
//! failure policy, with the local share's divided policy sets.

use std::sync::Arc;

use crate::limiter::check::Inner;
use crate::limiter::decision::{
    Decision, DecisionSource, RateLimitInfo, Receipt, UnlimitedReason, whole_seconds,
};
use crate::limiter::domains::Domain;
use crate::limiter::failure::FailurePolicy;
use crate::limiter::policy_set::PolicySet;
use crate::store::backend::{StoreError, StoreErrorKind};
use crate::store::caller::Caller;
use crate::store::domain::FailureDomain;
use crate::store::policy::Policy;

/// Why a decision fell back to the failure policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FallbackReason {
    /// The store did not answer within the store timeout.
    Timeout,
    /// The store refused or dropped the connection (a call failed so, or the latest
    /// attempt to connect was refused and the store was not asked).
    Refused,
    /// The store answered with an error.
    OtherError,
    /// The breaker is open: the store was not asked.
    BreakerOpen,
    /// The store has no connection yet (it is being made, or made again): it was not
    /// asked.
    NotConnected,
}

impl FallbackReason {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            FallbackReason::Timeout => "timeout",
            FallbackReason::Refused => "refused",
            FallbackReason::OtherError => "other_error",
            FallbackReason::BreakerOpen => "breaker_open",
            FallbackReason::NotConnected => "not_connected",
        }
    }

    /// The reason of a decision that did not call the store because `domain` has no
    /// connection.
    pub(crate) fn without_a_connection(domain: FailureDomain) -> Self {
        if domain.is_refused() {
            FallbackReason::Refused
        } else {
            FallbackReason::NotConnected
        }
    }

    pub(crate) fn of(error: &StoreError) -> Self {
        match error.kind() {
            StoreErrorKind::Timeout => FallbackReason::Timeout,
            StoreErrorKind::Unavailable => FallbackReason::Refused,
            StoreErrorKind::NotConnected => FallbackReason::NotConnected,
            _ => FallbackReason::OtherError,
        }
    }
}

/// A policy set, a divisor, and the set divided by it.
pub(super) type Share = (Arc<[Policy]>, u64, Arc<[Policy]>);

impl Inner {
    /// The store of failure domain `domain` could not decide, for `reason`: counts it, and
    /// decides by the failure policy.
    pub(super) fn fall_back(
        &self,
        domain: &Domain,
        caller: &Caller,
        set: &PolicySet,
        reason: FallbackReason,
        cost: u64,
        now: Option<u64>,
    ) -> Decision {
        domain.fallbacks.count(reason);
        self.apply(&self.on_store_failure, domain, caller, set, cost, now)
    }

    /// Decides a request of `cost` units by the failure policy `policy`; `now` is the time
    /// on the limiter's clock when the caller has just read it.
    pub(super) fn apply(
        &self,
        policy: &FailurePolicy,
        domain: &Domain,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        now: Option<u64>,
    ) -> Decision {
        let limits = &set.limits;
        match policy {
            FailurePolicy::Open => Decision::Unlimited(UnlimitedReason::StoreFailedOpen),
            FailurePolicy::Closed => Decision::Unavailable {
                retry_after_secs: whole_seconds(domain.breaker.open_for_ms()),
                policies: limits.clone(),
            },
            FailurePolicy::LocalShare(instances) => {
                self.with_share(limits, instances.get(), |share| {
                    self.decide_share(caller, set, share, cost, now)
                })
            }
            FailurePolicy::Static => self
                .cached_refusal(caller, set, cost)
                .unwrap_or(Decision::Unlimited(UnlimitedReason::StoreFailedOpen)),
            FailurePolicy::StaticThen(rest) => self
                .cached_refusal(caller, set, cost)
                .unwrap_or_else(|| self.apply(rest, domain, caller, set, cost, now)),
        }
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

    pub(super) fn cached_refusal(
        &self,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
    ) -> Option<Decision> {
        let denials = self.denials.as_ref()?;
        denials
            .covering(caller.key(), set.id, self.clock.now_millis(), cost)
            .map(Decision::Limited)
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
