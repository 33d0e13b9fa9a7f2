//! Leases on the request path: spend the caller's lease, take one when the caller is hot,
//! give back what an ended lease left.
//!
//! A lease is taken through the breaker and under the store timeout like any store call;
//! when that fails the request gets the failure policy, and what the store grants after
//! the timeout goes back to it. A lease already held is spent
//! whatever the store's state: its units were counted when it was taken.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::limiter::breaker::{Admission, Permit};
use crate::limiter::decision::{Decision, DecisionSource, FallbackReason, RateLimitInfo, Receipt};
use crate::limiter::domains::{Domain, not_connected};
use crate::limiter::lease::leasing::Leasing;
use crate::limiter::lease::table::{Lease, Next, Step};
use crate::limiter::path::remote::RemotePath;
use crate::limiter::policy_set::PolicySet;
use crate::store::algorithm::{Algorithm, PolicyOutcome};
use crate::store::backend::{LeaseGrant, Refund, StoreError};
use crate::store::caller::{Caller, CallerKey};
use crate::store::domain::FailureDomain;
use crate::store::future::StoreFuture;
use crate::store::policy::Policy;

/// Decides a request of `cost` units from the caller's lease, or by taking one; `None`
/// when the request is for the store alone (the caller is not hot, a lease is being
/// taken, or the store does not lease).
pub(in crate::limiter) fn leased(
    path: &Arc<RemotePath>,
    leasing: &Leasing,
    caller: &Caller,
    set: &PolicySet,
    cost: u64,
) -> Option<StoreFuture<Decision>> {
    // A peek consumes nothing; the store answers it exactly. A sliding log is exact only
    // if every unit counts when it is spent: a leased unit spent later would count in a
    // window that never saw it. A lockout is the store's to start, on the request that
    // uses the quota up.
    if cost == 0
        || set.locks_out
        || leasing.unsupported.load(Ordering::Relaxed)
        || set
            .limits
            .iter()
            .any(|limit| matches!(limit.algorithm(), Algorithm::SlidingLog { .. }))
    {
        return None;
    }
    let now = path.clock.now_millis();
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
    // Each to the caller and the policies it was counted under: a sweep ends other
    // callers' leases too.
    for unused in unused {
        give_back(
            path,
            &unused.caller,
            &unused.limits,
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
            Some(StoreFuture::ready(Decision::Allowed(info)))
        }
        Step::Take { units } => take(path, leasing, caller, set, cost, units, now),
    }
}

/// Takes a lease of `units` for a request of `cost` units, asked at `asked_ms`.
#[allow(clippy::too_many_arguments)]
fn take(
    path: &Arc<RemotePath>,
    leasing: &Leasing,
    caller: &Caller,
    set: &PolicySet,
    cost: u64,
    units: u64,
    asked_ms: u64,
) -> Option<StoreFuture<Decision>> {
    let (reach, domain) = path.domain_of(caller.key());
    let permit = match permit(path, reach, &domain) {
        Ok(permit) => permit,
        Err(reason) => {
            leasing.table.granted(caller.key(), set.id, None);
            let decision = path.fall_back(&domain, caller, set, reason, cost, None);
            return Some(StoreFuture::ready(decision));
        }
    };
    let domain = domain.to_shared();
    let Some(lease) = path
        .store
        .backend()
        .lease(caller.key(), &set.limits, cost, units)
    else {
        leasing.unsupported.store(true, Ordering::Relaxed);
        leasing.table.granted(caller.key(), set.id, None);
        return None;
    };
    let started = std::time::Instant::now();
    let taking = Taking {
        path: path.clone(),
        caller: caller.clone(),
        set: set.clone(),
        lease: Some(lease),
        settled: false,
    };
    Some(StoreFuture::boxed(async move {
        // The whole guard moves in, so it lives (and settles) with the future; it
        // holds the store's answer until it comes.
        let mut taking = taking;
        let result = taking.answer().await;
        let Taking {
            path, caller, set, ..
        } = &taking;
        path.store.answered(started);
        let decision = match result {
            Ok(grant) => {
                permit.success();
                granted(path, caller, set, grant, cost, asked_ms)
            }
            Err(error) => {
                let elsewhere = path.charge_failure(domain.id, permit, &error);
                let charged = elsewhere.as_deref().unwrap_or(&domain);
                not_granted(path, charged, caller, set, &error, cost)
            }
        };
        taking.settled = true;
        decision
    }))
}

/// The breaker's leave to ask the caller's part of the store (`reach`) for a lease, or
/// why the failure policy decides instead.
fn permit(
    path: &RemotePath,
    reach: FailureDomain,
    domain: &Domain,
) -> Result<Permit, FallbackReason> {
    match domain.admit_at(reach, || path.clock.now_millis()) {
        Admission::Call(permit) if reach.can_call() => Ok(permit),
        Admission::Call(permit) => {
            // No connection to call on: a failure for the breaker, without a call.
            permit.failed(&not_connected());
            Err(FallbackReason::without_a_connection(reach))
        }
        Admission::Reject => Err(FallbackReason::BreakerOpen),
    }
}

/// Taking a lease failed with `error`: the caller may take another, and the failure
/// policy decides the request.
fn not_granted(
    path: &RemotePath,
    domain: &Domain,
    caller: &Caller,
    set: &PolicySet,
    error: &StoreError,
    cost: u64,
) -> Decision {
    if let Some(leasing) = &path.leases {
        leasing.table.granted(caller.key(), set.id, None);
    }
    tracing::debug!(layer = %path.name, %error, "taking a lease failed");
    let reason = FallbackReason::of(error);
    path.fall_back(domain, caller, set, reason, cost, None)
}

/// A lease being taken for a request that may be dropped (its client went away) before
/// the store answers: the caller is then free to take another, instead of waiting forever
/// for this one.
///
/// The store's answer, while it has not come (the request was dropped, or stopped waiting
/// at the store timeout), is awaited in the background: the store may still grant the
/// lease, and what it grants goes back ([`finish_late`]).
struct Taking {
    path: Arc<RemotePath>,
    caller: Caller,
    set: PolicySet,
    lease: Option<StoreFuture<Result<LeaseGrant, StoreError>>>,
    settled: bool,
}

impl Taking {
    /// The store's answer to the lease, within the store timeout; once it has come, the
    /// guard no longer holds it.
    async fn answer(&mut self) -> Result<LeaseGrant, StoreError> {
        let Some(lease) = self.lease.as_mut() else {
            return Err(StoreError::other("the lease was answered already"));
        };
        match tokio::time::timeout(self.path.store.timeout(), lease).await {
            Ok(result) => {
                self.lease = None;
                result
            }
            Err(_) => Err(self.path.store.timed_out(self.caller.key(), "lease")),
        }
    }
}

impl Drop for Taking {
    fn drop(&mut self) {
        if !self.settled
            && let Some(leasing) = &self.path.leases
        {
            leasing.table.granted(self.caller.key(), self.set.id, None);
        }
        if let Some(lease) = self.lease.take() {
            finish_late(&self.path, self.caller.key(), &self.set.limits, lease);
        }
    }
}

/// Awaits, in the background, a lease whose request stopped waiting for it, and gives
/// back what the store granted: a store that answers late (Redis runs the lease script
/// after the timeout all the same) consumed units that nobody holds. The answer and the
/// give-back are awaited as long as the units could still weigh (the longest retention of
/// the policies); a give-back does not wait for the breaker, since the store just answered.
fn finish_late(
    path: &Arc<RemotePath>,
    caller: &CallerKey,
    limits: &Arc<[Policy]>,
    lease: StoreFuture<Result<LeaseGrant, StoreError>>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weighs_for = Duration::from_millis(
        limits
            .iter()
            .map(Policy::retention_ms)
            .max()
            .unwrap_or(0)
            .max(1),
    );
    let (path, caller, limits) = (path.clone(), caller.clone(), limits.clone());
    runtime.spawn(async move {
        let Ok(Ok(grant)) = tokio::time::timeout(weighs_for, lease).await else {
            return;
        };
        if grant.granted() == 0 {
            return;
        }
        let refund = Refund::new(grant.granted(), grant.outcome().counted_at_ms());
        let returning = path.clone();
        path.store
            .give_back(&caller, &limits, refund, weighs_for, move |given_back| {
                if given_back {
                    if let Some(leasing) = &returning.leases {
                        leasing.metrics.returned();
                    }
                } else {
                    tracing::debug!(
                        layer = %returning.name,
                        "a lease answered late could not be given back"
                    );
                }
            });
    });
}

/// The store answered a lease: the request is admitted from it (and the rest kept), or
/// refused as the store would refuse it alone.
fn granted(
    path: &RemotePath,
    caller: &Caller,
    set: &PolicySet,
    grant: LeaseGrant,
    cost: u64,
    asked_ms: u64,
) -> Decision {
    let Some(leasing) = &path.leases else {
        return path.decided(caller, set, grant.outcome(), asked_ms, cost);
    };
    if grant.granted() < cost {
        leasing.table.granted(caller.key(), set.id, None);
        return path.decided(caller, set, grant.outcome(), asked_ms, cost);
    }
    // Where the caller's local share starts if the store goes away while it spends.
    path.fallback
        .remember(caller, set, grant.outcome(), asked_ms);
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
            limits: set.limits.clone(),
        }),
    );
    // The store just granted units: a refusal cached meanwhile (a request it refused while
    // this lease was being taken) no longer holds.
    path.forget_refusal(caller, set.id);
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
    RateLimitInfo::of_store(
        set.reported.clone(),
        &outcomes,
        DecisionSource::Lease,
        cost,
        Receipt::of_admission(true, counted_at_ms),
    )
}

/// Gives the unused units of an ended lease of `caller` back to the store, in the
/// background when the store does I/O; a failure leaves them consumed, the stricter
/// outcome.
fn give_back(path: &Arc<RemotePath>, caller: &CallerKey, limits: &Arc<[Policy]>, refund: Refund) {
    if path.not_asked_to_give_back(caller).is_some() {
        return;
    }
    let returning = path.clone();
    path.store.give_back(
        caller,
        limits,
        refund,
        path.store.timeout(),
        move |given_back| {
            if given_back && let Some(leasing) = &returning.leases {
                leasing.metrics.returned();
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Limiter;
    use crate::limiter::failure::FailurePolicy;
    use crate::limiter::lease::config::Leases;
    use crate::store::backend::{Backend, CheckOutcome};
    use crate::store::clock::ManualClock;
    use crate::store::future::StoreFuture;
    use crate::store::memory::InMemoryBackend;
    use crate::store::policy::Quota;

    /// The start of a minute, so that a per-minute window holds the whole test.
    const START_MS: u64 = 1_800_000_000_000;

    /// The in-process store declared remote, so the limiter leases from it; its lease is
    /// granted when asked (as the Redis script runs a lease) and answered `late` afterwards.
    #[derive(Clone, Debug)]
    struct Shared {
        store: InMemoryBackend,
        late: Option<Duration>,
    }

    impl Backend for Shared {
        fn check(
            &self,
            caller: &CallerKey,
            limits: &Arc<[Policy]>,
            cost: u64,
        ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
            self.store.check(caller, limits, cost)
        }

        fn refund(
            &self,
            caller: &CallerKey,
            limits: &Arc<[Policy]>,
            refund: Refund,
        ) -> StoreFuture<Result<(), StoreError>> {
            self.store.refund(caller, limits, refund)
        }

        fn lease(
            &self,
            caller: &CallerKey,
            limits: &Arc<[Policy]>,
            cost: u64,
            units: u64,
        ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
            let grant =
                crate::store::lease::lease_by_checks(&self.store, caller, limits, cost, units);
            let late = self.late;
            Some(StoreFuture::boxed(async move {
                if let Some(late) = late {
                    tokio::time::sleep(late).await;
                }
                grant
            }))
        }

        fn is_remote(&self) -> bool {
            true
        }
    }

    /// What the store has counted for `caller` under `limiter`'s only policy.
    fn counted(store: &InMemoryBackend, limiter: &Limiter, caller: &Caller) -> u64 {
        let limits = limiter.policies();
        let peek = store
            .check(caller.key(), &limits, 0)
            .try_take_ready()
            .unwrap()
            .unwrap();
        limits[0].quota() - peek.limits()[0].remaining
    }

    fn limiter(shared: &Shared, clock: &ManualClock, quota: Quota) -> Limiter {
        Limiter::builder()
            .name("leased")
            .backend(shared.clone())
            .clock(clock.clone())
            .store_timeout(Duration::from_millis(20))
            .on_store_failure(FailurePolicy::closed())
            .policy(Policy::sliding_window("per-minute", quota))
            .leases(
                Leases::new()
                    .threshold_per_sec(10)
                    .period(Duration::from_millis(100)),
            )
            .build()
    }

    /// A lease ended by a sweep that another caller of its shard set off goes back to the
    /// caller that took it, never to the one whose request swept it.
    #[tokio::test]
    async fn regression_an_ended_lease_goes_back_to_its_own_caller() {
        let clock = ManualClock::new(START_MS);
        let store = InMemoryBackend::new().clock(clock.clone());
        let shared = Shared {
            store: store.clone(),
            late: None,
        };
        let limiter = limiter(&shared, &clock, Quota::per_minute(1_000));
        let table = &limiter
            .remote_path()
            .unwrap()
            .leases
            .as_ref()
            .unwrap()
            .table;
        let a = Caller::new("a");
        let b = (0..)
            .map(|i| Caller::new(format!("b{i}")))
            .find(|b| table.shard_index(b.key()) == table.shard_index(a.key()))
            .unwrap();
        let (mut spent_a, mut spent_b) = (0, 0);
        // b, under the threshold, is decided by the store request by request.
        for _ in 0..5 {
            spent_b += u64::from(limiter.check(&b).await.is_allowed());
        }
        // a gets hot, leases, spends part of its lease and stops.
        for _ in 0..150 {
            clock.advance(Duration::from_millis(1));
            spent_a += u64::from(limiter.check(&a).await.is_allowed());
        }
        assert!(counted(&store, &limiter, &a) > spent_a, "a holds no lease");
        // a's lease has expired; b's next request, a second on, sweeps the shard.
        clock.advance(Duration::from_millis(1_500));
        spent_b += u64::from(limiter.check(&b).await.is_allowed());
        assert_eq!(
            (counted(&store, &limiter, &a), counted(&store, &limiter, &b)),
            (spent_a, spent_b),
            "the store's counts of a and b against what each spent"
        );
    }

    /// A lease answered after the store timeout was still granted by the store: its units
    /// come back, so the store's count ends at what was spent.
    #[tokio::test(start_paused = true)]
    async fn regression_a_lease_answered_after_the_timeout_gives_its_units_back() {
        let clock = ManualClock::new(START_MS);
        let store = InMemoryBackend::new().clock(clock.clone());
        let shared = Shared {
            store: store.clone(),
            late: Some(Duration::from_millis(50)),
        };
        let limiter = limiter(&shared, &clock, Quota::per_minute(1_000));
        let acme = Caller::new("acme");
        let mut spent = 0;
        let mut unavailable = 0;
        for _ in 0..200 {
            clock.advance(Duration::from_millis(5));
            match limiter.check(&acme).await {
                decision if decision.is_allowed() => spent += 1,
                Decision::Unavailable { .. } => unavailable += 1,
                _ => {}
            }
        }
        assert!(unavailable > 0, "no lease timed out");
        // The late answers arrive, and what they granted goes back.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            counted(&store, &limiter, &acme),
            spent,
            "the store's count against what was spent ({unavailable} requests unavailable)"
        );
    }
}
