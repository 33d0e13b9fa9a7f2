//! The limiter and its check: the request path below HTTP.
//!
//! mode -> denial cache -> breaker -> store under a timeout -> (on failure) the failure
//! policy, in [`fallback`](super::fallback).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tracing::{Instrument, Span};

use crate::limiter::breaker::{Admission, BreakerState, Permit};
use crate::limiter::builder::LimiterBuilder;
use crate::limiter::decision::{Decision, DecisionSource, RateLimitInfo, Receipt, UnlimitedReason};
use crate::limiter::denial_cache::DenialCache;
use crate::limiter::domains::{Domain, DomainRef, Domains, not_connected};
use crate::limiter::failure::FailurePolicy;
use crate::limiter::fallback::{FallbackReason, Share};
use crate::limiter::future::DecisionFuture;
use crate::limiter::lease::path::{Leasing, leased};
use crate::limiter::limits::{ActiveLimits, LimitsHandle, SwappableLimits};
use crate::limiter::mode::{Mode, ModeSwitch};
use crate::limiter::policy_set::PolicySet;
use crate::limiter::telemetry::{self, LimiterMetrics};
use crate::store::backend::{Backend, CheckFuture, CheckResult, StoreError, StoreErrorKind};
use crate::store::caller::{Caller, CallerKey};
use crate::store::clock::Clock;
use crate::store::domain::FailureDomain;
use crate::store::memory::InMemoryBackend;
use crate::store::policy::Policy;

/// Decides requests for a set of policies on one store. Cheap to clone; clones share the
/// store, the breaker, the denial cache and the configuration.
///
/// ```
/// use tollgate::{Caller, Limiter, Policy, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(2)))
///     .build();
/// let acme = Caller::new("acme");
/// assert!(limiter.check(&acme).await.is_allowed());
/// assert!(limiter.check(&acme).await.is_allowed());
/// assert!(!limiter.check(&acme).await.is_allowed());
/// # }
/// ```
#[derive(Clone)]
pub struct Limiter {
    pub(super) inner: Arc<Inner>,
}

/// What clones of a limiter share; built by the builder, read along the request path.
pub(super) struct Inner {
    pub(super) name: Arc<str>,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) remote: bool,
    /// The policies in force, swapped whole by a [`LimitsHandle`].
    pub(super) limits: SwappableLimits,
    /// What policies' counters are scoped by.
    pub(super) scope: Arc<str>,
    pub(super) on_store_failure: FailurePolicy,
    pub(super) store_timeout: Duration,
    pub(super) mode: ModeSwitch,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) metrics: LimiterMetrics,
    /// A circuit breaker per failure domain of the store.
    pub(super) domains: Domains,
    pub(super) denials: Option<DenialCache>,
    /// Counters of the local share, kept apart from the store's.
    pub(super) local: InMemoryBackend,
    /// Divided policy sets by (original set, divisor), so a share costs no allocation per
    /// request.
    pub(super) shares: ArcSwap<Vec<Share>>,
    /// Hot callers' leases of quota, when the limiter leases.
    pub(super) leases: Option<Leasing>,
}

impl Limiter {
    /// Starts configuring a limiter.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// Decides one request of `caller`, costing one unit.
    pub fn check(&self, caller: &Caller) -> DecisionFuture {
        self.check_cost(caller, 1)
    }

    /// Decides one request of `caller` that consumes `cost` units from every policy, all
    /// or nothing.
    ///
    /// A cost above a policy's quota can never be admitted: it is refused at once, without
    /// asking the store ([`RateLimitInfo::unaffordable`] names the policy). A cost of 0
    /// consumes nothing and reports what remains (a peek).
    ///
    /// ```
    /// use tollgate::{Caller, Decision, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .build();
    /// let acme = Caller::new("acme");
    /// let Decision::Allowed(info) = limiter.check_cost(&acme, 30).await else { panic!() };
    /// assert_eq!(info.min_remaining(), Some(20));
    /// assert!(!limiter.check_cost(&acme, 21).await.is_allowed());
    /// # }
    /// ```
    pub fn check_cost(&self, caller: &Caller, cost: u64) -> DecisionFuture {
        let inner = &self.inner;
        let mode = inner.mode.get();
        if mode == Mode::Off {
            return DecisionFuture::ready(Decision::Unlimited(UnlimitedReason::Off));
        }
        // Span::none() unless a subscriber wants decision spans; entered for the part of
        // the check done here, and carried by the future for the rest.
        let span = telemetry::decision_span(&inner.name);
        let _entered = (!span.is_disabled()).then(|| span.enter());
        let active = inner.limits_in_force();
        let set = active.for_caller(caller);
        if let Some(refusal) = set.unaffordable(cost) {
            return DecisionFuture::ready(inner.conclude(refusal, mode, &span));
        }
        let limits = &set.limits;
        if !inner.remote {
            // An in-process store cannot be down: no breaker or denial cache.
            let mut check = inner.backend.check(caller.key(), limits, cost);
            if let Some(result) = check.try_take_ready() {
                // Nothing to cache either: the denial cache is only read in front of a
                // remote store, so the clock is not read for it.
                return DecisionFuture::ready(inner.conclude(
                    inner.decided(caller, set, result, None, cost),
                    mode,
                    &span,
                ));
            }
            // One that answers later (its work on a spawned task or a blocking pool) may
            // have counted the request already: it is awaited, under the store timeout,
            // never asked again.
            return inner.awaited_locally(check, caller, set, cost, mode, &span);
        }
        // Read once, and only if needed: by a cached refusal, an open breaker, or as the
        // time the store was asked.
        let mut read_clock = None;
        let mut now = || *read_clock.get_or_insert_with(|| inner.clock.now_millis());
        if let Some(denials) = &inner.denials
            && !denials.is_empty()
            && let Some(info) = denials.get(caller.key(), set.id, now(), cost)
        {
            inner.metrics.denial_cache_hit();
            return DecisionFuture::ready(inner.conclude(Decision::Limited(info), mode, &span));
        }
        if let Some(leasing) = &inner.leases
            && let Some(decision) = leased(&self.inner, leasing, caller, set, cost, mode, &span)
        {
            return decision;
        }
        let (reach, domain) = inner.domain_of(caller.key());
        let permit = match domain.admit_at(reach, &mut now) {
            Admission::Call(permit) => permit,
            Admission::Reject => {
                let reason = FallbackReason::BreakerOpen;
                let decision = inner.fall_back(&domain, caller, set, reason, cost, read_clock);
                return DecisionFuture::ready(inner.conclude(decision, mode, &span));
            }
        };
        if !reach.can_call() {
            // No connection to call on: a failure for the breaker, without a call.
            permit.failed(&not_connected());
            let reason = FallbackReason::without_a_connection(reach);
            let decision = inner.fall_back(&domain, caller, set, reason, cost, read_clock);
            return DecisionFuture::ready(inner.conclude(decision, mode, &span));
        }
        let now = now();
        let started = Instant::now();
        let mut check = inner.backend.check(caller.key(), limits, cost);
        if let Some(result) = check.try_take_ready() {
            inner.metrics.store_latency(started.elapsed());
            let decision = inner.finish(&domain, caller, set, result, permit, now, cost);
            return DecisionFuture::ready(inner.conclude(decision, mode, &span));
        }
        let domain = domain.to_shared();
        let inner = self.inner.clone();
        let caller = caller.clone();
        let set = set.clone();
        let instrumented = span.clone();
        let span = span.clone();
        DecisionFuture::boxed(
            async move {
                let result = match tokio::time::timeout(inner.store_timeout, check).await {
                    Ok(result) => result,
                    Err(_) => Err(inner.timed_out(caller.key(), "answer")),
                };
                inner.metrics.store_latency(started.elapsed());
                let decision = inner.finish(&domain, &caller, &set, result, permit, now, cost);
                inner.conclude(decision, mode, &span)
            }
            .instrument(instrumented),
        )
    }

    /// The switch that moves this limiter between enforce, shadow and off.
    pub fn mode_switch(&self) -> &ModeSwitch {
        &self.inner.mode
    }

    /// The handle that replaces this limiter's policies and tiers while it runs.
    pub fn limits_handle(&self) -> LimitsHandle {
        LimitsHandle::new(self.inner.clone())
    }

    /// The policies in force for callers without a tier, in order, counted under this
    /// limiter's scope.
    pub fn policies(&self) -> Arc<[Policy]> {
        self.inner.limits_in_force().default_set().limits.clone()
    }

    /// The limiter's name, used in metric labels and logs.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Where the circuit breaker stands: with a store of several parts (the masters of a
    /// Redis Cluster), each part has its own, and this is the most open of them (open if
    /// any is open, else half-open if any is probing, else closed).
    ///
    /// ```
    /// use tollgate::decision::BreakerState;
    /// let limiter = tollgate::Limiter::builder()
    ///     .policy(tollgate::Policy::sliding_window("per-second", tollgate::Quota::per_second(5)))
    ///     .build();
    /// assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    /// ```
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.domains.state()
    }

    /// Each part of the store's circuit breaker, by the part's label as the store gives it
    /// (a cluster master's address; the label of a single-node store's one part), in the
    /// order the limiter met them. The `node` label of `tollgate_breaker_state` is the same.
    ///
    /// ```
    /// use tollgate::decision::BreakerState;
    /// let limiter = tollgate::Limiter::builder()
    ///     .policy(tollgate::Policy::sliding_window("per-second", tollgate::Quota::per_second(5)))
    ///     .build();
    /// assert_eq!(limiter.breaker_states(), [(String::new(), BreakerState::Closed)]);
    /// ```
    pub fn breaker_states(&self) -> Vec<(String, BreakerState)> {
        self.inner.domains.states()
    }
}

impl Inner {
    /// Counts the decision and records it on its span, and in shadow mode lets it through
    /// whatever it says.
    pub(super) fn conclude(&self, decision: Decision, mode: Mode, span: &Span) -> Decision {
        let decision = match mode {
            Mode::Shadow => Decision::Shadowed(Box::new(decision)),
            _ => decision,
        };
        self.metrics.decision(&decision);
        telemetry::record_decision(span, &decision);
        if let Decision::Limited(info) = &decision {
            tracing::debug!(
                layer = %self.name,
                policy = info.violated().next().map(|p| p.name()).unwrap_or_default(),
                retry_after_secs = info.retry_after_secs(),
                "request refused"
            );
        }
        decision
    }

    /// The limits in force now; a decision reads them once, so a swap never splits it.
    fn limits_in_force(&self) -> arc_swap::Guard<Arc<ActiveLimits>> {
        self.limits.load()
    }

    /// The answer of an in-process store that was not ready at once, awaited under the
    /// store timeout; a timeout meets the failure policy.
    fn awaited_locally(
        self: &Arc<Self>,
        check: CheckFuture,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        mode: Mode,
        span: &Span,
    ) -> DecisionFuture {
        let inner = self.clone();
        let caller = caller.clone();
        let set = set.clone();
        let concluding = span.clone();
        DecisionFuture::boxed(
            async move {
                let result = match tokio::time::timeout(inner.store_timeout, check).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::new(
                        StoreErrorKind::Timeout,
                        format!(
                            "no answer within the store timeout of {:?}",
                            inner.store_timeout
                        ),
                    )),
                };
                let decision = inner.decided(&caller, &set, result, None, cost);
                inner.conclude(decision, mode, &concluding)
            }
            .instrument(span.clone()),
        )
    }

    /// Which part of the store decides `caller`, whether it is connected, and the limiter's
    /// breaker for that part.
    pub(super) fn domain_of(&self, caller: &CallerKey) -> (FailureDomain, DomainRef<'_>) {
        let reach = self.backend.failure_domain(caller);
        (reach, self.domains.get(reach.id(), &*self.backend))
    }

    /// The error of a store call that ran out of time, waiting for `what`: a timeout,
    /// unless the caller's part of the store is still not connected, when the call waited
    /// for the connection, not for the store (and the breaker waits for the connection).
    pub(super) fn timed_out(&self, caller: &CallerKey, what: &str) -> StoreError {
        if self.backend.failure_domain(caller).is_connected() {
            StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "no {what} within the store timeout of {:?}",
                    self.store_timeout
                ),
            )
        } else {
            StoreError::new(
                StoreErrorKind::NotConnected,
                format!(
                    "no connection to the store within the store timeout of {:?}",
                    self.store_timeout
                ),
            )
        }
    }

    /// A store answered (or failed): tell the breaker, cache a refusal, or fall back.
    /// `asked_ms` is when the store was asked.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        domain: &Domain,
        caller: &Caller,
        set: &PolicySet,
        result: CheckResult,
        permit: Permit,
        asked_ms: u64,
        cost: u64,
    ) -> Decision {
        match result {
            Ok(outcome) => {
                permit.success();
                self.decided(caller, set, Ok(outcome), Some(asked_ms), cost)
            }
            Err(error) => {
                permit.failed(&error);
                tracing::debug!(layer = %self.name, node = %domain.label, %error, "store call failed");
                self.fall_back(domain, caller, set, FallbackReason::of(&error), cost, None)
            }
        }
    }

    /// The store's answer as a decision. A remote store's refusal (`asked_ms` given) is
    /// cached until its retry time counted from `asked_ms`: the store decided at some
    /// instant between the question and the answer, so counting from the question never
    /// outlives the store's own refusal.
    pub(super) fn decided(
        &self,
        caller: &Caller,
        set: &PolicySet,
        result: CheckResult,
        asked_ms: Option<u64>,
        cost: u64,
    ) -> Decision {
        let limits = &set.limits;
        match result {
            Ok(outcome) => {
                let mut info =
                    RateLimitInfo::from_outcomes(limits, outcome.limits(), DecisionSource::Store)
                        .for_cost(cost);
                if outcome.admitted() {
                    info = info.with_receipt(Receipt {
                        counted_at_ms: outcome.counted_at_ms(),
                        set_id: set.id,
                    });
                }
                if let Some(denials) = &self.denials
                    && let Some(asked_ms) = asked_ms
                {
                    // A refusal holds until its retry time; so does the refusal that an
                    // admission leaving a policy at r=0 announces for the next request.
                    // Other instances can only make the caller's state stricter in the
                    // meantime, so a cached refusal never refuses what the store would admit.
                    let refusal = if outcome.admitted() {
                        info.next_refusal()
                    } else {
                        Some(info.clone())
                    };
                    if let Some(refusal) = refusal {
                        let retry_ms = refusal.retry_after_ms();
                        denials.insert(caller.key(), set.id, &refusal, asked_ms, retry_ms);
                    }
                }
                if outcome.admitted() {
                    Decision::Allowed(info)
                } else {
                    Decision::Limited(info)
                }
            }
            // Only an in-process store's answer comes here unguarded; it does not fail, but
            // if a custom one does, it gets the failure policy too.
            Err(error) => {
                let (_, domain) = self.domain_of(caller.key());
                self.fall_back(&domain, caller, set, FallbackReason::of(&error), cost, None)
            }
        }
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.inner.name)
            .field("backend", &self.inner.backend)
            .field("limits", &self.inner.limits)
            .field("on_store_failure", &self.inner.on_store_failure)
            .field("store_timeout", &self.inner.store_timeout)
            .field("breakers", &self.inner.domains)
            .finish_non_exhaustive()
    }
}
