//! Giving back what an admitted request consumed, when it turns out not to count (a
//! successful login on a route that counts failed attempts).
//!
//! The units go back to the store that counted them: the shared store, or this instance's
//! local share when that decided. A decision that counted nothing (failed open, served
//! from a cached refusal, unlimited, refused) has nothing to give back. A refund that
//! fails is logged and counted, never an error for the request: the units stay consumed,
//! which is the stricter outcome.

use std::time::Instant;

use tracing::Instrument;

use crate::limiter::breaker::BreakerState;
use crate::limiter::check::{Inner, Limiter};
use crate::limiter::decision::{Decision, DecisionSource, Receipt};
use crate::store::backend::{Backend, Refund, RefundFuture, StoreError, StoreErrorKind};
use crate::store::caller::{Caller, CallerKey};

impl Limiter {
    /// Gives back what `decision` (of `caller`, made by this limiter) consumed.
    ///
    /// Resolves to `Ok` once the store has taken the units back (or when there was
    /// nothing to give back), to the store's error otherwise; either way the refund is
    /// counted in `tollgate_refunds_total` and a failure is logged, so callers may ignore
    /// the result. A refund invalidates the caller's cached refusal.
    ///
    /// In shadow mode the store counted the request as in enforce mode, so its units are
    /// given back too: shadow mode keeps predicting what enforcement would do.
    ///
    /// Give each decision back at most once: a second refund of the same decision would
    /// give back units that other requests consumed.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("attempts", Quota::per_minute(5)))
    ///     .build();
    /// let alice = Caller::new("alice");
    /// let login = limiter.check(&alice).await;
    /// // The password was right: the attempt does not count.
    /// limiter.refund(&alice, &login).await.unwrap();
    /// let next = limiter.check(&alice).await;
    /// assert_eq!(next.info().and_then(|info| info.min_remaining()), Some(4));
    /// # }
    /// ```
    pub fn refund(&self, caller: &Caller, decision: &Decision) -> RefundFuture {
        let info = match decision {
            Decision::Allowed(info) => info,
            Decision::Shadowed(would_be) => match would_be.as_ref() {
                Decision::Allowed(info) => info,
                _ => return RefundFuture::ready(Ok(())),
            },
            _ => return RefundFuture::ready(Ok(())),
        };
        let Some(receipt) = info.receipt() else {
            return RefundFuture::ready(Ok(()));
        };
        if info.cost() == 0 {
            return RefundFuture::ready(Ok(()));
        }
        let inner = &self.inner;
        let refund = Refund::new(info.cost(), receipt.counted_at_ms);
        let limits = info.policy_set();
        match info.source() {
            DecisionSource::LocalShare => {
                let mut future = inner.local.refund(caller.key(), limits, refund);
                let result = future
                    .try_take_ready()
                    .unwrap_or_else(|| Err(StoreError::new(StoreErrorKind::Other, "pending")));
                inner.refunded(caller.key(), receipt, &result);
                RefundFuture::ready(result)
            }
            // A lease's units were counted by the store: they go back there.
            DecisionSource::Store | DecisionSource::Lease => {
                if inner.remote {
                    let (reach, domain) = inner.domain_of(caller.key());
                    let skipped = if !reach.can_call() {
                        Some((
                            StoreErrorKind::NotConnected,
                            "the store has no connection yet",
                        ))
                    } else if domain.breaker.state() == BreakerState::Open {
                        Some((
                            StoreErrorKind::Unavailable,
                            "the circuit breaker is open: the store is not asked",
                        ))
                    } else {
                        None
                    };
                    if let Some((kind, message)) = skipped {
                        let result = Err(StoreError::new(kind, message));
                        inner.refunded(caller.key(), receipt, &result);
                        return RefundFuture::ready(result);
                    }
                }
                // A store call like a decision's: its latency is recorded the same way (an
                // in-process store's calls are not timed).
                let started = Instant::now();
                let mut future = inner.backend.refund(caller.key(), limits, refund);
                if let Some(result) = future.try_take_ready() {
                    if inner.remote {
                        inner.metrics.store_latency(started.elapsed());
                    }
                    inner.refunded(caller.key(), receipt, &result);
                    return RefundFuture::ready(result);
                }
                let inner = self.inner.clone();
                let caller = caller.key().clone();
                let span = tracing::Span::current();
                RefundFuture::boxed(
                    async move {
                        let result = match tokio::time::timeout(inner.store_timeout, future).await {
                            Ok(result) => result,
                            Err(_) => Err(StoreError::new(
                                StoreErrorKind::Timeout,
                                format!(
                                    "no answer within the store timeout of {:?}",
                                    inner.store_timeout
                                ),
                            )),
                        };
                        if inner.remote {
                            inner.metrics.store_latency(started.elapsed());
                        }
                        inner.refunded(&caller, receipt, &result);
                        result
                    }
                    .instrument(span),
                )
            }
            _ => RefundFuture::ready(Ok(())),
        }
    }
}

impl Inner {
    /// Counts a refund; after one that was made, forgets the caller's cached refusal, which
    /// may no longer hold.
    fn refunded(&self, caller: &CallerKey, receipt: Receipt, result: &Result<(), StoreError>) {
        match result {
            Ok(()) => {
                if let Some(denials) = &self.denials {
                    denials.remove(caller, receipt.set_id);
                }
                self.metrics.refund(true);
            }
            Err(error) => {
                tracing::warn!(layer = %self.name, %error, "could not give units back to the store");
                self.metrics.refund(false);
            }
        }
    }
}
