//! The path to an in-process store: the store is asked once, and what it answers is the
//! decision. A custom in-process store that fails, or answers later than the store timeout,
//! meets the failure policy all the same.

use std::sync::Arc;
use std::time::Instant;

use crate::limiter::Conclusion;
use crate::limiter::decision::{Decision, FallbackReason};
use crate::limiter::failure::{Failure, Fallback};
use crate::limiter::path::{answered, answered_one};
use crate::limiter::policy_set::PolicySet;
use crate::limiter::store_call::StoreCall;
use crate::limiter::telemetry::FallbackCounters;
use crate::store::backend::{CheckOutcome, Refund, StoreError};
use crate::store::caller::Caller;
use crate::store::future::StoreFuture;
use crate::store::memory::InMemoryBackend;
use crate::store::policy::Policy;

/// An in-process store and the failure policy for the rare store that fails.
pub(in crate::limiter) struct LocalPath {
    pub(super) store: StoreCall,
    /// The store again when it is the crate's own: asked by a direct call, its answer
    /// neither boxed nor wrapped in a `Result` it never fails with.
    memory: Option<InMemoryBackend>,
    pub(super) fallback: Fallback,
    /// The store's one part, as metrics label it.
    label: Arc<str>,
    fallbacks: FallbackCounters,
}

impl LocalPath {
    pub(in crate::limiter) fn new(
        store: StoreCall,
        memory: Option<InMemoryBackend>,
        fallback: Fallback,
        layer: &Arc<str>,
    ) -> Self {
        let label: Arc<str> = store
            .backend()
            .failure_domain_label(0)
            .unwrap_or_default()
            .into();
        let fallbacks = FallbackCounters::new(layer, fallback.policy().as_str(), &label);
        Self {
            store,
            memory,
            fallback,
            label,
            fallbacks,
        }
    }

    pub(super) fn label(&self) -> &str {
        &self.label
    }

    /// The in-process store's decision, asked by a direct call; any other store's answer,
    /// at once if it has it.
    #[inline]
    pub(super) fn decide(
        self: &Arc<Self>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        conclusion: &Conclusion<'_>,
    ) -> StoreFuture<Decision> {
        let Some(memory) = &self.memory else {
            return self.ask_concluded(caller, set, cost, conclusion);
        };
        let now = memory.now_ms();
        if let [limit] = &*set.limits
            && let Some(outcome) = memory.decide_one_at(caller.key(), limit, cost, now)
        {
            let admitted = outcome.admitted;
            return conclusion.of(admitted, set.locks_out, cost, move || {
                Decision::answered(admitted, answered_one(set, outcome, now, cost))
            });
        }
        let outcome = memory.decide_at(caller.key(), &set.limits, cost, now);
        let admitted = outcome.admitted();
        conclusion.of(admitted, set.locks_out, cost, || {
            Decision::answered(admitted, answered(set, &outcome, cost))
        })
    }

    /// [`ask`](Self::ask), concluded. Out of line, as the in-process store's path is
    /// smaller (and faster) without it.
    #[inline(never)]
    fn ask_concluded(
        self: &Arc<Self>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        conclusion: &Conclusion<'_>,
    ) -> StoreFuture<Decision> {
        conclusion.answer(self.ask(caller, set, cost))
    }

    /// Asks a store other than the crate's own.
    fn ask(self: &Arc<Self>, caller: &Caller, set: &PolicySet, cost: u64) -> StoreFuture<Decision> {
        let mut check = self.store.backend().check(caller.key(), &set.limits, cost);
        if let Some(result) = check.try_take_ready() {
            return StoreFuture::ready(self.decided(caller, set, result, cost));
        }
        // The clock is read only for an answer that keeps the request waiting: a ready one
        // costs no clock read.
        let started = Instant::now();
        // One that answers later (its work on a spawned task or a blocking pool) may have
        // counted the request already: it is awaited, under the store timeout, never asked
        // again.
        let path = self.clone();
        let caller = caller.clone();
        let set = set.clone();
        StoreFuture::boxed(async move {
            let result = path
                .store
                .wait(check, started, caller.key(), "answer")
                .await;
            path.decided(&caller, &set, result, cost)
        })
    }

    fn decided(
        &self,
        caller: &Caller,
        set: &PolicySet,
        result: Result<CheckOutcome, StoreError>,
        cost: u64,
    ) -> Decision {
        match result {
            Ok(outcome) => Decision::answered(outcome.admitted(), answered(set, &outcome, cost)),
            Err(error) => {
                let failure = Failure {
                    reason: FallbackReason::of(&error),
                    counters: &self.fallbacks,
                    breaker: None,
                    denials: None,
                    now: None,
                };
                self.fallback.decide(&failure, caller, set, cost)
            }
        }
    }

    pub(super) fn refund(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        self.store.refund(caller.key(), limits, refund)
    }

    pub(super) fn charge(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        self.store.charge(caller.key(), limits, units)
    }
}

impl std::fmt::Debug for LocalPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPath")
            .field("store", &self.store)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}
