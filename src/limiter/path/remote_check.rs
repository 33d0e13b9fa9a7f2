//! The request path on a remote store: the denial cache, a hot caller's lease, the breaker
//! of the caller's part of the store, the call under the store timeout, and the failure
//! policy when the store cannot decide.

use std::sync::Arc;
use std::time::Instant;

use crate::limiter::Conclusion;
use crate::limiter::breaker::{Admission, Permit};
use crate::limiter::decision::{Decision, FallbackReason};
use crate::limiter::domains::{Domain, DomainRef, not_connected};
use crate::limiter::failure::Held;
use crate::limiter::lease::path::leased;
use crate::limiter::path::remote::RemotePath;
use crate::limiter::policy_set::PolicySet;
use crate::store::backend::{CheckOutcome, LeaseGrant, StoreError};
use crate::store::caller::Caller;
use crate::store::future::StoreFuture;

impl RemotePath {
    // Out of line: inlined, its guards made the limiter's check three times the code,
    // and the in-process path through it 10% slower.
    #[inline(never)]
    pub(super) fn decide(
        self: &Arc<Self>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        conclusion: &Conclusion<'_>,
    ) -> StoreFuture<Decision> {
        // Read once, and only if needed: by a cached refusal, an open breaker, or as the
        // time the store was asked.
        let mut read_clock = None;
        let mut now = || *read_clock.get_or_insert_with(|| self.clock.now_millis());
        if let Some(refused) = self.cached_refusal(caller, set, cost, &mut now) {
            return conclusion.decision(refused);
        }
        // While what a local share counted still weighs, no lease is served or taken,
        // whose units the share would not see.
        let share_weighs = self.fallback.may_weigh() && self.fallback.share_weighs(now());
        if !share_weighs
            && let Some(leasing) = &self.leases
            && let Some(reply) = leased(self, leasing, caller, set, cost)
        {
            return conclusion.answer(reply);
        }
        let (reach, domain) = self.domain_of(caller.key());
        let permit = match domain.admit_at(reach, &mut now) {
            Admission::Call(permit) => permit,
            Admission::Reject => {
                let reason = FallbackReason::BreakerOpen;
                let failure = self.failure(&domain, reason, read_clock);
                return self
                    .fallback
                    .decide_concluded(&failure, caller, set, cost, conclusion);
            }
        };
        // And the callers a share counted are decided by their share as well as by the
        // store, which did not see those requests. The breaker's probe too: admitted by the
        // store alone, each instance's probe would come on top of the shares. A probe the
        // share refuses still asks the store, for nothing (a cost of 0), so that the
        // breaker can close.
        let mut question = Question {
            cost,
            asked_ms: 0,
            held: None,
            refused_by_share: None,
        };
        if share_weighs {
            match self.fallback.recovering(caller, set, cost, now()) {
                Some(Err(refused)) if permit.is_probe() => {
                    question.refused_by_share = Some(refused);
                }
                Some(Err(refused)) => return conclusion.decision(refused),
                Some(Ok(counted)) => question.held = Some(counted),
                None => {}
            }
        }
        if !reach.can_call() {
            // No connection to call on: a failure for the breaker, without a call.
            permit.failed(&not_connected());
            self.release(caller, question.held);
            let reason = FallbackReason::without_a_connection(reach);
            return conclusion
                .decision(self.fall_back(&domain, caller, set, reason, cost, read_clock));
        }
        question.asked_ms = now();
        conclusion.answer(self.call(&domain, caller, set, permit, question))
    }

    /// A refusal of the caller that the denial cache still holds; the clock is read only
    /// when the cache holds any.
    fn cached_refusal(
        &self,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        now: impl FnOnce() -> u64,
    ) -> Option<Decision> {
        let denials = self
            .denials
            .as_ref()
            .filter(|denials| !denials.is_empty())?;
        let info = denials.get(caller.key(), set.id, now(), cost)?;
        self.metrics.denial_cache_hit();
        Some(Decision::Limited(info))
    }

    /// Asks the store `question` under the breaker's `permit`, and makes its answer
    /// the decision, at once or when it comes.
    fn call(
        self: &Arc<Self>,
        domain: &DomainRef<'_>,
        caller: &Caller,
        set: &PolicySet,
        permit: Permit,
        question: Question,
    ) -> StoreFuture<Decision> {
        let started = Instant::now();
        let mut check = self.ask(caller, set, &question);
        if let Some(result) = check.try_take_ready() {
            self.store.answered(started);
            return StoreFuture::ready(self.finish(domain, caller, set, result, permit, question));
        }
        let domain = domain.to_shared();
        let path = self.clone();
        let caller = caller.clone();
        let set = set.clone();
        StoreFuture::boxed(async move {
            let result = path
                .store
                .wait(check, started, caller.key(), "answer")
                .await;
            path.finish(&domain, &caller, &set, result, permit, question)
        })
    }

    /// The store's decision on a request; for a caller that a local share counted while
    /// the store was away, the request and what the share counted, consumed as far as
    /// the limits allow (a lease's arithmetic: the units beyond the request are dropped);
    /// for a probe the share refused, nothing.
    fn ask(
        &self,
        caller: &Caller,
        set: &PolicySet,
        question: &Question,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let backend = self.store.backend();
        let cost = question.cost;
        if question.refused_by_share.is_some() {
            return backend.check(caller.key(), &set.limits, 0);
        }
        let unseen = question.held.as_ref().map_or(0, |held| held.unseen);
        if unseen > 0
            && cost > 0
            && let Some(mut lease) =
                backend.lease(caller.key(), &set.limits, cost, cost.saturating_add(unseen))
        {
            let outcome =
                |grant: Result<LeaseGrant, StoreError>| grant.map(|g| g.outcome().clone());
            return match lease.try_take_ready() {
                Some(grant) => StoreFuture::ready(outcome(grant)),
                None => StoreFuture::boxed(async move { outcome(lease.await) }),
            };
        }
        backend.check(caller.key(), &set.limits, cost)
    }

    /// A store answered (or failed): tell the breaker, cache a refusal, or fall back.
    fn finish(
        &self,
        domain: &Domain,
        caller: &Caller,
        set: &PolicySet,
        result: Result<CheckOutcome, StoreError>,
        permit: Permit,
        question: Question,
    ) -> Decision {
        let Question {
            cost,
            asked_ms,
            held,
            refused_by_share,
        } = question;
        match (result, refused_by_share) {
            (Ok(_), Some(refused)) => {
                permit.success();
                refused
            }
            (Ok(outcome), None) => {
                permit.success();
                let shared = match held {
                    Some(held) if outcome.admitted() => {
                        self.fallback.reconcile(caller, &held, &outcome);
                        true
                    }
                    held => {
                        self.release(caller, held);
                        false
                    }
                };
                match self.decided(caller, set, &outcome, asked_ms, cost) {
                    Decision::Allowed(info) if shared => {
                        Decision::Allowed(info.counted_by_share_too())
                    }
                    decision => decision,
                }
            }
            (Err(error), _) => {
                let elsewhere = self.charge_failure(domain.id, permit, &error);
                let charged = elsewhere.as_deref().unwrap_or(domain);
                // The failure policy decides again, the local share included.
                self.release(caller, held);
                tracing::debug!(layer = %self.name, node = %charged.label, %error, "store call failed");
                self.fall_back(charged, caller, set, FallbackReason::of(&error), cost, None)
            }
        }
    }
}

/// How the store is asked about a request.
struct Question {
    /// The units the request costs.
    cost: u64,
    /// When the store was asked (the limiter's time).
    asked_ms: u64,
    /// What the local share counted for the request before, given back unless the store
    /// admits it.
    held: Option<Held>,
    /// The share's refusal of a breaker's probe: the store is asked for nothing, and the
    /// refusal stands once it answers.
    refused_by_share: Option<Decision>,
}
