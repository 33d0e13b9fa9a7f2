//! One call to the store, made the same way by a decision, a lease, a refund and a lease's
//! give-back: under the store timeout, with its latency recorded, a timeout told apart
//! from a connection not made yet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::limiter::telemetry::LimiterMetrics;
use crate::store::backend::{Backend, CheckOutcome, Refund, StoreError};
use crate::store::caller::CallerKey;
use crate::store::future::StoreFuture;
use crate::store::policy::Policy;

/// The store and how the limiter calls it. Cheap to clone, for the calls that outlive the
/// request.
#[derive(Clone)]
pub(super) struct StoreCall {
    backend: Arc<dyn Backend>,
    timeout: Duration,
    metrics: Arc<LimiterMetrics>,
    /// Whether calls are timed: those of a remote store, where latency is worth watching.
    timed: bool,
}

impl StoreCall {
    pub(super) fn new(
        backend: Arc<dyn Backend>,
        timeout: Duration,
        metrics: Arc<LimiterMetrics>,
    ) -> Self {
        let timed = backend.is_remote();
        Self {
            backend,
            timeout,
            metrics,
            timed,
        }
    }

    /// The store itself.
    pub(super) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Records the latency of a call started at `started` that has answered.
    pub(super) fn answered(&self, started: Instant) {
        if self.timed {
            self.metrics.store_latency(started.elapsed());
        }
    }

    /// Waits for a call started at `started`, under the store timeout; `what` names the
    /// answer waited for, in the timeout's message.
    pub(super) async fn wait<T>(
        &self,
        call: StoreFuture<Result<T, StoreError>>,
        started: Instant,
        caller: &CallerKey,
        what: &str,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(self.timed_out(caller, what)),
        };
        self.answered(started);
        result
    }

    /// The error of a call that ran out of time waiting for `what`: a timeout, unless the
    /// caller's part of the store is still not connected, when the call waited for the
    /// connection, not for the store (and the breaker waits for the connection).
    pub(super) fn timed_out(&self, caller: &CallerKey, what: &str) -> StoreError {
        if self.backend.failure_domain(caller).is_connected() {
            StoreError::timeout(format!(
                "no {what} within the store timeout of {:?}",
                self.timeout
            ))
        } else {
            StoreError::not_connected(format!(
                "no connection to the store within the store timeout of {:?}",
                self.timeout
            ))
        }
    }

    /// Gives `refund` back to the store: the answer at once when the store has it, else a
    /// future that waits under the store timeout.
    pub(super) fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        let started = Instant::now();
        let mut call = self.backend.refund(caller, limits, refund);
        if let Some(result) = call.try_take_ready() {
            self.answered(started);
            return StoreFuture::ready(result);
        }
        let store = self.clone();
        let caller = caller.clone();
        StoreFuture::boxed(
            async move { store.wait(call, started, &caller, "answer").await }
                .instrument(tracing::Span::current()),
        )
    }

    /// Charges `units` more to the store (past the quota if need be): the answer at once
    /// when the store has it, else a future that waits under the store timeout.
    pub(super) fn charge(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let started = Instant::now();
        let mut call = self.backend.charge(caller, limits, units);
        if let Some(result) = call.try_take_ready() {
            self.answered(started);
            return StoreFuture::ready(result);
        }
        let store = self.clone();
        let caller = caller.clone();
        StoreFuture::boxed(
            async move { store.wait(call, started, &caller, "answer").await }
                .instrument(tracing::Span::current()),
        )
    }

    /// Gives `refund` back in the background (on the current runtime, if any), waiting up
    /// to `within` for the store; `done` learns whether it was given back.
    pub(super) fn give_back(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
        within: Duration,
        done: impl FnOnce(bool) + Send + 'static,
    ) {
        let started = Instant::now();
        let mut call = self.backend.refund(caller, limits, refund);
        if let Some(result) = call.try_take_ready() {
            self.answered(started);
            done(result.is_ok());
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            let result = tokio::time::timeout(within, call).await;
            store.answered(started);
            done(matches!(result, Ok(Ok(()))));
        });
    }

    /// The store timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl std::fmt::Debug for StoreCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCall")
            .field("backend", &self.backend)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}
