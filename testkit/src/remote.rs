//! The in-process store dressed as a remote one, so that a limiter puts its breaker, store
//! timeout, denial cache and failure policy in front of it; it can be taken down at will.
//! With a `ManualClock` the runs are exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tollgate::Policy;
use tollgate::future::StoreFuture;
use tollgate::{
    InMemoryBackend,
    store::{Backend, CallerKey, CheckOutcome, LeaseGrant, Refund, StoreError},
};

/// An [`InMemoryBackend`] that reports itself remote; clones share the store and the switch.
#[derive(Clone, Debug)]
pub struct Remote {
    store: InMemoryBackend,
    down: Arc<AtomicBool>,
}

impl Remote {
    /// `store`, up.
    pub fn new(store: InMemoryBackend) -> Self {
        Self {
            store,
            down: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Takes the store down (every call fails as a refused connection) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

impl Backend for Remote {
    fn check(
        &self,
        caller: &CallerKey,
        policies: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        if self.down.load(Ordering::SeqCst) {
            return StoreFuture::ready(Err(StoreError::unavailable("taken down by the test")));
        }
        self.store.check(caller, policies, cost)
    }

    fn refund(
        &self,
        caller: &CallerKey,
        policies: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        if self.down.load(Ordering::SeqCst) {
            return StoreFuture::ready(Err(StoreError::unavailable("taken down by the test")));
        }
        self.store.refund(caller, policies, refund)
    }

    fn lease(
        &self,
        caller: &CallerKey,
        policies: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        if self.down.load(Ordering::SeqCst) {
            return Some(StoreFuture::ready(Err(StoreError::unavailable(
                "taken down by the test",
            ))));
        }
        self.store.lease(caller, policies, cost, units)
    }
}
