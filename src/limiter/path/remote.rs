//! What deciding on a remote store takes, and the steps that deciding a request (see
//! `remote_check`) and taking a lease (see `lease::path`) share: finding the breaker of the
//! caller's part of the store, turning the store's answer into a decision, falling back to
//! the failure policy, and giving units back.

use std::sync::Arc;

use crate::limiter::breaker::{BreakerState, Permit};
use crate::limiter::decision::{Decision, FallbackReason};
use crate::limiter::denial_cache::DenialCache;
use crate::limiter::domains::{Domain, DomainRef, Domains};
use crate::limiter::failure::{Failure, Fallback, Held};
use crate::limiter::lease::leasing::Leasing;
use crate::limiter::path::answered;
use crate::limiter::policy_set::PolicySet;
use crate::limiter::store_call::StoreCall;
use crate::limiter::telemetry::LimiterMetrics;
use crate::store::backend::{CheckOutcome, Refund, StoreError};
use crate::store::caller::{Caller, CallerKey};
use crate::store::clock::Clock;
use crate::store::domain::FailureDomain;
use crate::store::future::StoreFuture;
use crate::store::policy::Policy;

/// What deciding on a remote store takes.
pub(in crate::limiter) struct RemotePath {
    pub(in crate::limiter) name: Arc<str>,
    pub(in crate::limiter) store: StoreCall,
    pub(in crate::limiter) clock: Arc<dyn Clock>,
    /// A circuit breaker per failure domain of the store.
    domains: Domains,
    pub(super) denials: Option<DenialCache>,
    pub(in crate::limiter) fallback: Fallback,
    /// Hot callers' leases of quota, when the limiter leases.
    pub(in crate::limiter) leases: Option<Leasing>,
    pub(super) metrics: Arc<LimiterMetrics>,
}

/// The parts of a [`RemotePath`], as the builder assembles them.
pub(in crate::limiter) struct RemoteParts {
    pub(in crate::limiter) name: Arc<str>,
    pub(in crate::limiter) store: StoreCall,
    pub(in crate::limiter) clock: Arc<dyn Clock>,
    pub(in crate::limiter) domains: Domains,
    pub(in crate::limiter) denials: Option<DenialCache>,
    pub(in crate::limiter) fallback: Fallback,
    pub(in crate::limiter) leases: Option<Leasing>,
    pub(in crate::limiter) metrics: Arc<LimiterMetrics>,
}

impl RemotePath {
    pub(in crate::limiter) fn new(parts: RemoteParts) -> Self {
        let RemoteParts {
            name,
            store,
            clock,
            domains,
            denials,
            fallback,
            leases,
            metrics,
        } = parts;
        Self {
            name,
            store,
            clock,
            domains,
            denials,
            fallback,
            leases,
            metrics,
        }
    }

    /// Which part of the store decides `caller`, whether it is connected, and the limiter's
    /// breaker for that part.
    pub(in crate::limiter) fn domain_of(
        &self,
        caller: &CallerKey,
    ) -> (FailureDomain, DomainRef<'_>) {
        let reach = self.store.backend().failure_domain(caller);
        (reach, self.domains.get(reach.id(), self.store.backend()))
    }

    /// The store's answer as a decision. A refusal is cached until its retry time counted
    /// from `asked_ms`: the store decided at some instant between the question and the
    /// answer, so counting from the question never outlives the store's own refusal.
    pub(in crate::limiter) fn decided(
        &self,
        caller: &Caller,
        set: &PolicySet,
        outcome: &CheckOutcome,
        asked_ms: u64,
        cost: u64,
    ) -> Decision {
        let info = answered(set, outcome, cost);
        self.fallback.remember(caller, set, outcome, asked_ms);
        if let Some(denials) = &self.denials {
            // A refusal holds until its retry time; so does the refusal that an admission
            // leaving a policy at r=0 announces for the next request. Other instances can
            // only make the caller's state stricter in the meantime, so a cached refusal
            // never refuses what the store would admit.
            let refusal = if outcome.admitted() {
                info.next_refusal()
            } else {
                Some(info.clone())
            };
            // Not while this instance holds (or is taking) a lease of the caller's: the
            // store refused because the lease holds the units, which the lease still serves.
            let leased = self
                .leases
                .as_ref()
                .is_some_and(|leasing| leasing.holds(caller.key(), set.id));
            let refusal = refusal.filter(|_| !leased);
            if let Some(refusal) = refusal {
                let retry_ms = refusal.retry_after_ms();
                denials.insert(caller.key(), set.id, &refusal, asked_ms, retry_ms);
            }
        }
        Decision::answered(outcome.admitted(), info)
    }

    /// Counts a failed call against the part of the store it failed at: the part `asked`
    /// (whose breaker gave `permit`), unless the store says the call ended at another (a
    /// redirect sent it there), whose breaker then counts the failure and which is
    /// returned. The asked part's breaker counts nothing for such a call: it only passed it
    /// on.
    pub(in crate::limiter) fn charge_failure(
        &self,
        asked: u32,
        permit: Permit,
        error: &StoreError,
    ) -> Option<DomainRef<'_>> {
        match error.failure_domain() {
            Some(failed_at) if failed_at != asked => {
                drop(permit);
                let domain = self.domains.get(failed_at, self.store.backend());
                domain.breaker.charge(error);
                Some(domain)
            }
            _ => {
                permit.failed(error);
                None
            }
        }
    }

    /// The part `domain` of the store could not decide, for `reason`: the failure policy
    /// decides. `now` is the limiter's time, when already read.
    pub(in crate::limiter) fn fall_back(
        &self,
        domain: &Domain,
        caller: &Caller,
        set: &PolicySet,
        reason: FallbackReason,
        cost: u64,
        now: Option<u64>,
    ) -> Decision {
        let failure = self.failure(domain, reason, now);
        self.fallback.decide(&failure, caller, set, cost)
    }

    /// The failure of a call to `domain` for `reason`, as the failure policy meets it.
    pub(in crate::limiter) fn failure<'a>(
        &'a self,
        domain: &'a Domain,
        reason: FallbackReason,
        now: Option<u64>,
    ) -> Failure<'a> {
        Failure {
            reason,
            counters: &domain.fallbacks,
            breaker: Some(&domain.breaker),
            denials: self.denials.as_ref(),
            now,
        }
    }

    /// Gives back to the local share what it counted for a request the store decides.
    pub(super) fn release(&self, caller: &Caller, held: Option<Held>) {
        if let Some(held) = held {
            self.fallback.release(caller, held);
        }
    }

    /// Gives back to the store what a request it admitted (or a lease it granted)
    /// consumed; not tried while the caller's part of the store is known to be down.
    pub(super) fn refund(
        self: &Arc<Self>,
        caller: &Caller,
        set_id: u64,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        if let Some(not_asked) = self.not_asked_to_give_back(caller.key()) {
            return StoreFuture::ready(Err(not_asked));
        }
        let mut call = self.store.refund(caller.key(), limits, refund);
        match call.try_take_ready() {
            Some(result) => {
                if result.is_ok() {
                    self.forget_refusal(caller, set_id);
                }
                StoreFuture::ready(result)
            }
            None => {
                let path = self.clone();
                let caller = caller.clone();
                StoreFuture::boxed(async move {
                    let result = call.await;
                    if result.is_ok() {
                        path.forget_refusal(&caller, set_id);
                    }
                    result
                })
            }
        }
    }

    /// Charges to the store what a request it admitted (or a lease it granted) cost beyond
    /// what it reserved; not tried while the caller's part of the store is known to be
    /// down.
    pub(super) fn charge(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        if let Some(not_asked) = self.not_asked_to_give_back(caller.key()) {
            return StoreFuture::ready(Err(not_asked));
        }
        self.store.charge(caller.key(), limits, units)
    }

    /// Why the store is not asked to give units of `caller` back now, if it is not: the
    /// caller's part of the store has no connection, or its breaker is open.
    pub(in crate::limiter) fn not_asked_to_give_back(
        &self,
        caller: &CallerKey,
    ) -> Option<StoreError> {
        let (reach, domain) = self.domain_of(caller);
        if !reach.can_call() {
            Some(StoreError::not_connected("the store has no connection yet"))
        } else if domain.breaker.state() == BreakerState::Open {
            Some(StoreError::unavailable(
                "the circuit breaker is open: the store is not asked",
            ))
        } else {
            None
        }
    }

    /// A refund landed, or a lease was granted: a refusal cached for the caller by the
    /// policy set `set_id` no longer holds.
    pub(in crate::limiter) fn forget_refusal(&self, caller: &Caller, set_id: u64) {
        if let Some(denials) = &self.denials {
            denials.remove(caller.key(), set_id);
        }
    }

    pub(super) fn breaker_state(&self) -> BreakerState {
        self.domains.state()
    }

    pub(super) fn breaker_states(&self) -> Vec<(String, BreakerState)> {
        self.domains.states()
    }
}

impl std::fmt::Debug for RemotePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePath")
            .field("store", &self.store)
            .field("breakers", &self.domains)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}
