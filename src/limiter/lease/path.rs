//! Leases on the request path: spend the caller's lease, take one when the caller is hot,
//! give back what an ended lease left.
//!
//! A lease is taken through the breaker and under the store timeout like any store call;
//! when that fails the request gets the failure policy. A lease already held is spent
//! whatever the store's state: its units were counted when it was taken.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics::SharedString;
use tracing::{Instrument, Span};

use crate::limiter::breaker::{Admission, BreakerState};
use crate::limiter::check::Inner;
use crate::limiter::decision::{Decision, DecisionSource, RateLimitInfo, Receipt};
use crate::limiter::domains::not_connected;
use crate::limiter::fallback::FallbackReason;
use crate::limiter::future::DecisionFuture;
use crate::limiter::lease::config::Leases;
use crate::limiter::lease::metrics::LeaseMetrics;
use crate::limiter::lease::table::{Lease, LeaseTable, Next, Sizing, Step};
use crate::limiter::mode::Mode;
use crate::limiter::policy_set::PolicySet;
use crate::store::algorithm::{Algorithm, PolicyOutcome};
use crate::store::backend::{LeaseGrant, Refund};
use crate::store::caller::Caller;
use crate::store::policy::Policy;

/// A limiter's leasing: its configuration, its callers' leases and its counters.
pub(crate) struct Leasing {
    config: Leases,
    table: LeaseTable,
    metrics: LeaseMetrics,
    /// The store answered that it does not lease: every request asks it.
    unsupported: AtomicBool,
}

impl Leasing {
    pub(crate) fn new(config: Leases, layer: &Arc<str>) -> Self {
        Self {
            table: LeaseTable::new(config.caller_capacity()),
            metrics: LeaseMetrics::new(&SharedString::from_shared(layer.clone())),
            config,
            unsupported: AtomicBool::new(false),
        }
    }

    fn sizing(&self, limits: &[Policy]) -> Sizing {
        let instances = self.config.instance_count().max(1);
        let cap = limits
            .iter()
            .map(|limit| limit.algorithm().quota() / instances)
            .min()
            .unwrap_or(0);
        Sizing {
            threshold_per_sec: self.config.threshold(),
            period_ms: self.config.period_ms(),
            cap,
        }
    }
}

impl std::fmt::Debug for Leasing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leasing")
            .field("config", &self.config)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// Decides a request of `cost` units from the caller's lease, or by taking one; `None`
/// when the request is for the store alone (the caller is not hot, a lease is being
/// taken, or the store does not lease).
pub(in crate::limiter) fn leased(
    inner: &Arc<Inner>,
    leasing: &Leasing,
    caller: &Caller,
    set: &PolicySet,
    cost: u64,
    mode: Mode,
    span: &Span,
) -> Option<DecisionFuture> {
    // A peek consumes nothing; the store answers it exactly.
    if cost == 0 || leasing.unsupported.load(Ordering::Relaxed) {
        return None;
    }
    let now = inner.clock.now_millis();
    let next = leasing
        .table
        .next(caller.key(), set.id, cost, now, leasing.sizing(&set.limits));
    let Next {
        step,
        unused,
        expired,
        spent,
    } = next;
    for _ in 0..expired {
        leasing.metrics.expired();
    }
    for _ in 0..spent {
        leasing.metrics.spent();
    }
    for unused in unused {
        give_back(
            inner,
            caller,
            set,
            Refund::new(unused.units, unused.counted_at_ms),
        );
    }
    match step {
        Step::Ask => None,
        Step::Served {
            left,
            counted_at_ms,
            shared,
        } => {
            leasing.metrics.served();
            let info = leased_info(set, &shared, left, cost, counted_at_ms);
            Some(DecisionFuture::ready(inner.conclude(
                Decision::Allowed(info),
                mode,
                span,
            )))
        }
        Step::Take { units } => take(inner, leasing, caller, set, cost, units, now, mode, span),
    }
}

/// Takes a lease of `units` for a request of `cost` units, asked at `asked_ms`.
#[allow(clippy::too_many_arguments)]
fn take(
    inner: &Arc<Inner>,
    leasing: &Leasing,
    caller: &Caller,
    set: &PolicySet,
    cost: u64,
    units: u64,
    asked_ms: u64,
    mode: Mode,
    span: &Span,
) -> Option<DecisionFuture> {
    let (reach, domain) = inner.domain_of(caller.key());
    let reason = match domain.admit_at(reach, || inner.clock.now_millis()) {
        Admission::Call(permit) if reach.can_call() => Ok(permit),
        Admission::Call(permit) => {
            // No connection to call on: a failure for the breaker, without a call.
            permit.failed(&not_connected());
            Err(FallbackReason::NotConnected)
        }
        Admission::Reject => Err(FallbackReason::BreakerOpen),
    };
    let permit = match reason {
        Ok(permit) => permit,
        Err(reason) => {
            leasing.table.granted(caller.key(), set.id, None);
            let decision = inner.fall_back(&domain, caller, set, reason, cost, None);
            return Some(DecisionFuture::ready(inner.conclude(decision, mode, span)));
        }
    };
    let domain = domain.to_shared();
    let Some(lease) = inner.backend.lease(caller.key(), &set.limits, cost, units) else {
        leasing.unsupported.store(true, Ordering::Relaxed);
        leasing.table.granted(caller.key(), set.id, None);
        return None;
    };
    let started = std::time::Instant::now();
    let inner = inner.clone();
    let caller = caller.clone();
    let set = set.clone();
    let concluding = span.clone();
    let taking = Taking {
        inner: inner.clone(),
        caller: caller.clone(),
        set_id: set.id,
        settled: false,
    };
    Some(DecisionFuture::boxed(
        async move {
            // The whole guard moves in, so it lives (and settles) with the future.
            let mut taking = taking;
            let result = match tokio::time::timeout(inner.store_timeout, lease).await {
                Ok(result) => result,
                Err(_) => Err(inner.timed_out(caller.key(), "lease")),
            };
            inner.metrics.store_latency(started.elapsed());
            let decision = match result {
                Ok(grant) => {
                    permit.success();
                    granted(&inner, &caller, &set, grant, cost, asked_ms)
                }
                Err(error) => {
                    permit.failed(&error);
                    if let Some(leasing) = &inner.leases {
                        leasing.table.granted(caller.key(), set.id, None);
                    }
                    tracing::debug!(layer = %inner.name, %error, "taking a lease failed");
                    inner.fall_back(
                        &domain,
                        &caller,
                        &set,
                        FallbackReason::of(&error),
                        cost,
                        None,
                    )
                }
            };
            taking.settled = true;
            inner.conclude(decision, mode, &concluding)
        }
        .instrument(span.clone()),
    ))
}

/// A lease being taken for a request that may be dropped (its client went away) before
/// the store answers: the caller is then free to take another, instead of waiting forever
/// for this one. Units the store granted to the dropped request stay consumed.
struct Taking {
    inner: Arc<Inner>,
    caller: Caller,
    set_id: u64,
    settled: bool,
}

impl Drop for Taking {
    fn drop(&mut self) {
        if !self.settled
            && let Some(leasing) = &self.inner.leases
        {
            leasing.table.granted(self.caller.key(), self.set_id, None);
        }
    }
}

/// The store answered a lease: the request is admitted from it (and the rest kept), or
/// refused as the store would refuse it alone.
fn granted(
    inner: &Inner,
    caller: &Caller,
    set: &PolicySet,
    grant: LeaseGrant,
    cost: u64,
    asked_ms: u64,
) -> Decision {
    let Some(leasing) = &inner.leases else {
        return inner.decided(
            caller,
            set,
            Ok(grant.outcome().clone()),
            Some(asked_ms),
            cost,
        );
    };
    if grant.granted() < cost {
        leasing.table.granted(caller.key(), set.id, None);
        let outcome = grant.outcome().clone();
        return inner.decided(caller, set, Ok(outcome), Some(asked_ms), cost);
    }
    leasing.metrics.taken();
    leasing.metrics.served();
    let counted_at_ms = grant.outcome().counted_at_ms();
    let left = grant.granted() - cost;
    let shared = grant.outcome().limits().to_vec();
    let info = leased_info(set, &shared, left, cost, counted_at_ms);
    let lasts_ms = lasting_ms(&set.limits, leasing.config.period_ms(), counted_at_ms);
    if left == 0 {
        leasing.metrics.spent();
    }
    leasing.table.granted(
        caller.key(),
        set.id,
        Some(Lease {
            left,
            // From the question, not the answer: the store counted at some instant after
            // it, so the lease never outlives the window its units were counted in.
            expires_at_ms: asked_ms.saturating_add(lasts_ms),
            counted_at_ms,
            shared,
        }),
    );
    Decision::Allowed(info)
}

/// How long a lease counted at `counted_at_ms` may be spent: the period, and for a
/// sliding window no later than the end of the fixed window its units were counted in
/// (spent later, they would count in a window that never saw them).
fn lasting_ms(limits: &[Policy], period_ms: u64, counted_at_ms: u64) -> u64 {
    limits
        .iter()
        .filter_map(|limit| match *limit.algorithm() {
            Algorithm::SlidingWindow { window_ms, .. } if window_ms > 0 => {
                Some(window_ms - counted_at_ms % window_ms)
            }
            _ => None,
        })
        .fold(period_ms, u64::min)
}

/// The report of a decision made from a lease: per policy, what the shared counter had
/// left after the grant plus what the lease still holds, never above the quota.
fn leased_info(
    set: &PolicySet,
    shared: &[PolicyOutcome],
    left: u64,
    cost: u64,
    counted_at_ms: u64,
) -> RateLimitInfo {
    let outcomes: Vec<PolicyOutcome> = set
        .limits
        .iter()
        .zip(shared)
        .map(|(limit, outcome)| PolicyOutcome {
            admitted: true,
            remaining: outcome
                .remaining
                .saturating_add(left)
                .min(limit.algorithm().quota()),
            reset_ms: outcome.reset_ms,
        })
        .collect();
    RateLimitInfo::from_outcomes(&set.limits, &outcomes, DecisionSource::Lease)
        .for_cost(cost)
        .with_receipt(Receipt {
            counted_at_ms,
            set_id: set.id,
        })
}

/// Gives the unused units of an ended lease back to the store, in the background when
/// the store does I/O; a failure leaves them consumed, the stricter outcome.
fn give_back(inner: &Arc<Inner>, caller: &Caller, set: &PolicySet, refund: Refund) {
    let (reach, domain) = inner.domain_of(caller.key());
    if !reach.can_call() || domain.breaker.state() == BreakerState::Open {
        return;
    }
    let mut future = inner.backend.refund(caller.key(), &set.limits, refund);
    let returned = |inner: &Inner, ok: bool| {
        if ok && let Some(leasing) = &inner.leases {
            leasing.metrics.returned();
        }
    };
    if let Some(result) = future.try_take_ready() {
        returned(inner, result.is_ok());
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner = inner.clone();
    runtime.spawn(async move {
        let result = tokio::time::timeout(inner.store_timeout, future).await;
        returned(&inner, matches!(result, Ok(Ok(()))));
    });
}
