//! A backend wrapper that counts the calls reaching the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::Policy;
use tollgate::future::StoreFuture;
use tollgate::store::{
    Backend, CallerKey, CheckOutcome, FailureDomain, LeaseGrant, Refund, StoreError,
};

/// Wraps a store and counts every call made to it.
#[derive(Clone, Debug)]
pub struct Counting<B> {
    inner: B,
    calls: Arc<AtomicU64>,
}

impl<B> Counting<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            calls: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// A handle that reads the count after the backend moved into a limiter.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.calls.clone()
    }
}

impl<B: Backend> Backend for Counting<B> {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.check(caller, limits, cost)
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        self.inner.refund(caller, limits, refund)
    }

    fn lease(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        let lease = self.inner.lease(caller, limits, cost, units)?;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Some(lease)
    }

    fn is_remote(&self) -> bool {
        self.inner.is_remote()
    }

    fn failure_domain(&self, caller: &CallerKey) -> FailureDomain {
        self.inner.failure_domain(caller)
    }

    fn failure_domain_label(&self, id: u32) -> Option<String> {
        self.inner.failure_domain_label(id)
    }
}
