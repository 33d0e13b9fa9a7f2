//! The way a decision goes, chosen once when the limiter is built: straight to an
//! in-process store ([`local`]), or through the guards a remote store needs ([`remote`],
//! and its request path in `remote_check`).

pub(super) mod local;
pub(super) mod remote;
mod remote_check;

use std::sync::Arc;

use crate::limiter::Conclusion;
use crate::limiter::breaker::BreakerState;
use crate::limiter::decision::{Decision, DecisionSource, RateLimitInfo, Receipt};
use crate::limiter::failure::Fallback;
use crate::limiter::policy_set::PolicySet;
use crate::limiter::store_call::StoreCall;
use crate::store::algorithm::PolicyOutcome;
use crate::store::backend::{CheckOutcome, Refund, StoreError};
use crate::store::caller::Caller;
use crate::store::future::StoreFuture;
use crate::store::policy::Policy;

use local::LocalPath;
use remote::RemotePath;

/// The path of a limiter's decisions.
#[derive(Debug)]
pub(super) enum Path {
    /// An in-process store: it cannot be down, so no breaker, denial cache or lease.
    Local(Arc<LocalPath>),
    /// A store across the network, behind its breakers, denial cache and leases.
    Remote(Arc<RemotePath>),
}

impl Path {
    /// Decides a request of `cost` units against `set`, concluded as `conclusion` says: a
    /// decision made within the call (the in-process store, a breaker open, a lease
    /// serving) is returned in a ready future, a plain admission counted before it is
    /// built and any other concluded in place once built. A pending answer is concluded
    /// when it comes, inside the decision's span, which the conclusion enters around it.
    #[inline]
    pub(super) fn decide(
        &self,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        conclusion: &Conclusion<'_>,
    ) -> StoreFuture<Decision> {
        match self {
            Path::Local(path) => path.decide(caller, set, cost, conclusion),
            Path::Remote(path) => path.decide(caller, set, cost, conclusion),
        }
    }

    /// Gives back to the store what a request it admitted consumed.
    /// `set_id` names the set whose cached refusal of `caller` the units make stale.
    pub(super) fn refund(
        &self,
        caller: &Caller,
        set_id: u64,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        match self {
            Path::Local(path) => path.refund(caller, limits, refund),
            Path::Remote(path) => path.refund(caller, set_id, limits, refund),
        }
    }

    /// Charges the store what a request it admitted cost beyond its reservation.
    pub(super) fn charge(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        match self {
            Path::Local(path) => path.charge(caller, limits, units),
            Path::Remote(path) => path.charge(caller, limits, units),
        }
    }

    /// Charges the local share what a request it admitted cost beyond its reservation.
    pub(super) fn charge_share(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> CheckOutcome {
        self.fallback().charge(caller, limits, units)
    }

    /// Gives back (`refund`) or charges (`charge` units) on the local share what changed of
    /// a request the store admitted and the share counted too.
    pub(super) fn settle_share_too(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        refund: Option<Refund>,
        charge: u64,
    ) {
        self.fallback()
            .settle_share_too(caller, limits, refund, charge);
    }

    /// Gives back to the local share what a request it admitted consumed.
    pub(super) fn refund_share(
        &self,
        caller: &Caller,
        set_id: u64,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> Result<(), StoreError> {
        match self {
            Path::Local(path) => path.fallback.refund(caller, limits, refund),
            Path::Remote(path) => {
                let result = path.fallback.refund(caller, limits, refund);
                if result.is_ok() {
                    path.forget_refusal(caller, set_id);
                }
                result
            }
        }
    }

    /// How the store is called.
    pub(super) fn store(&self) -> &StoreCall {
        match self {
            Path::Local(path) => &path.store,
            Path::Remote(path) => &path.store,
        }
    }

    /// The failure policy, in execution.
    pub(super) fn fallback(&self) -> &Fallback {
        match self {
            Path::Local(path) => &path.fallback,
            Path::Remote(path) => &path.fallback,
        }
    }

    /// The most open of the breakers (closed without a remote store).
    pub(super) fn breaker_state(&self) -> BreakerState {
        match self {
            Path::Local(_) => BreakerState::Closed,
            Path::Remote(path) => path.breaker_state(),
        }
    }

    /// Each breaker by its part of the store.
    pub(super) fn breaker_states(&self) -> Vec<(String, BreakerState)> {
        match self {
            Path::Local(path) => vec![(path.label().to_owned(), BreakerState::Closed)],
            Path::Remote(path) => path.breaker_states(),
        }
    }
}

/// A store's answer as what the decision reports: each policy's outcome, and for an
/// admission, the receipt a refund needs.
fn answered(set: &PolicySet, outcome: &CheckOutcome, cost: u64) -> RateLimitInfo {
    RateLimitInfo::of_store(
        set.reported.clone(),
        outcome.limits(),
        DecisionSource::Store,
        cost,
        Receipt::of_admission(outcome.admitted(), outcome.counted_at_ms()),
    )
}

/// [`answered`] for the answer about a set of one policy: its outcome, and when it was
/// counted.
#[inline(always)]
fn answered_one(
    set: &PolicySet,
    outcome: PolicyOutcome,
    counted_at_ms: u64,
    cost: u64,
) -> RateLimitInfo {
    RateLimitInfo::of_store_one(
        set.reported.clone(),
        outcome,
        DecisionSource::Store,
        cost,
        Receipt::of_admission(outcome.admitted, counted_at_ms),
    )
}
