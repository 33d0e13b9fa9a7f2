//! The decision floor: the limiter that runs the request path below HTTP, knowing no HTTP
//! or Redis type.
//!
//! A [`Limiter`] owns its parts: the [`limits`] in force (checked into [`policy_set`]s,
//! swapped by [`Limiter::set_limits`]), its [`mode`], its [`telemetry`], and the
//! [`path`] its decisions take, chosen when the [`builder`] assembles it: straight to an
//! in-process store, or through the [`denial_cache`], a hot caller's [`lease`], the
//! [`breaker`] of the caller's part of the store from [`domains`], and the
//! [`store_call`] under its timeout. When the store cannot decide, the route's [`failure`]
//! policy decides, with the divisor of a local share from [`instances`]. [`cost`] refuses
//! requests that cost more than a quota. [`decision`] is what comes out, concluded here
//! once: shadowed, counted and recorded.

pub(crate) mod bounded_map;
pub(crate) mod breaker;
pub(crate) mod builder;
pub(crate) mod cost;
pub(crate) mod decision;
pub(crate) mod denial_cache;
pub(crate) mod domains;
pub(crate) mod failure;
pub(crate) mod instances;
pub(crate) mod last_answers;
pub(crate) mod lease;
pub(crate) mod limits;
pub(crate) mod mode;
pub(crate) mod path;
pub(crate) mod policy_set;
pub(crate) mod report_words;
pub(crate) mod reported_set;
pub(crate) mod settlement;
pub(crate) mod store_call;
pub(crate) mod telemetry;

use std::fmt;
use std::sync::Arc;

use tracing::{Instrument, Span};

use crate::limiter::breaker::BreakerState;
use crate::limiter::builder::LimiterBuilder;
use crate::limiter::decision::{Decision, DecisionSource, UnlimitedReason};
use crate::limiter::limits::{InForce, Limits};
use crate::limiter::mode::{Mode, ModeSwitch};
use crate::limiter::path::Path;
use crate::limiter::settlement::Settlement;
use crate::limiter::telemetry::{LimiterMetrics, SettleResult};
use crate::store::backend::{CheckOutcome, Refund, StoreError};
use crate::store::build_error::BuildError;
use crate::store::caller::Caller;
use crate::store::future::StoreFuture;
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
    inner: Arc<Inner>,
}

/// What clones of a limiter share.
struct Inner {
    name: Arc<str>,
    mode: ModeSwitch,
    /// The policies in force, swapped by [`Limiter::set_limits`].
    limits: Arc<InForce>,
    metrics: Arc<LimiterMetrics>,
    path: Path,
}

impl Limiter {
    /// Starts configuring a limiter.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// Decides one request of `caller`, costing one unit.
    pub fn check(&self, caller: &Caller) -> StoreFuture<Decision> {
        self.check_cost(caller, 1)
    }

    /// Decides one request of `caller` that consumes `cost` units from every policy, all
    /// or nothing.
    ///
    /// A cost above a policy's quota can never be admitted: it is refused at once, without
    /// asking the store ([`RateLimitInfo::unaffordable`](crate::decision::RateLimitInfo::unaffordable) names the policy). A cost of 0
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
    pub fn check_cost(&self, caller: &Caller, cost: u64) -> StoreFuture<Decision> {
        self.check_with(caller, cost, Refusals::Refuse)
    }

    /// [`check_cost`](Self::check_cost), a refusal made as `refusals` says: a soft limit's
    /// is a [`Decision::SoftLimited`], counted as such.
    pub(crate) fn check_with(
        &self,
        caller: &Caller,
        cost: u64,
        refusals: Refusals,
    ) -> StoreFuture<Decision> {
        let inner = &self.inner;
        let mode = inner.mode.get();
        if mode == Mode::Off {
            return StoreFuture::ready(Decision::Unlimited(UnlimitedReason::Off));
        }
        // Span::none() unless a subscriber wants decision spans; entered for the part of
        // the check done here, and carried by the future for the rest.
        let span = telemetry::decision_span(&inner.name);
        let _entered = span.as_ref().map(Span::enter);
        // Read once, so a swap never splits a decision.
        let active = inner.limits.load();
        let set = active.for_caller(caller);
        // A member of nested budgets is counted, with every level's policies, under the
        // outermost level's key.
        let (counted_under, nested);
        let (caller, set) = match caller.counted_under() {
            None => (caller, &*set),
            Some(outermost) => {
                nested = active.nested(caller, &set);
                counted_under = outermost;
                (&counted_under, &nested)
            }
        };
        // Each path concludes what it decides: a plain admission as it is built, where the
        // caller receives it (a decision copied right after it was written is read back
        // before the writes have landed, which stalls); any other in place.
        let conclusion = Conclusion {
            limiter: self,
            mode,
            refusals,
            span: span.as_ref(),
        };
        match set.unaffordable(cost) {
            Some(refusal) => conclusion.decision(refusal),
            None => inner.path.decide(caller, set, cost, &conclusion),
        }
    }

    /// Concludes a decision the store answers later, inside its span.
    fn conclude_later(
        &self,
        pending: StoreFuture<Decision>,
        mode: Mode,
        refusals: Refusals,
        span: Option<Span>,
    ) -> StoreFuture<Decision> {
        let inner = self.inner.clone();
        let concluding = span.clone();
        StoreFuture::boxed(
            async move {
                let mut decision = pending.await;
                inner.conclude(&mut decision, mode, refusals, concluding.as_ref());
                decision
            }
            .instrument(span.unwrap_or_else(Span::none)),
        )
    }

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
    pub fn refund(
        &self,
        caller: &Caller,
        decision: &Decision,
    ) -> StoreFuture<Result<(), StoreError>> {
        let info = match decision {
            Decision::Allowed(info) => info,
            Decision::Shadowed(would_be) => match would_be.as_ref() {
                Decision::Allowed(info) => info,
                _ => return StoreFuture::ready(Ok(())),
            },
            _ => return StoreFuture::ready(Ok(())),
        };
        // Only a decision that counted units carries a receipt.
        let Some(receipt) = info.receipt() else {
            return StoreFuture::ready(Ok(()));
        };
        if info.cost() == 0 {
            return StoreFuture::ready(Ok(()));
        }
        let refund = Refund::new(info.cost(), receipt.counted_at_ms);
        let limits = info.policy_set();
        let inner = &self.inner;
        let set_id = self.set_id_now(caller);
        let counted_under = caller.counted_under();
        let caller = counted_under.as_ref().unwrap_or(caller);
        let mut given_back = match info.source() {
            DecisionSource::LocalShare => {
                StoreFuture::ready(inner.path.refund_share(caller, set_id, limits, refund))
            }
            // A lease's units were counted by the store: they go back there.
            DecisionSource::Store | DecisionSource::Lease => {
                if receipt.shared {
                    inner.path.settle_share_too(caller, limits, Some(refund), 0);
                }
                inner.path.refund(caller, set_id, limits, refund)
            }
            _ => return StoreFuture::ready(Ok(())),
        };
        if let Some(result) = given_back.try_take_ready() {
            inner.refunded(&result);
            return StoreFuture::ready(result);
        }
        let inner = self.inner.clone();
        StoreFuture::boxed(
            async move {
                let result = given_back.await;
                inner.refunded(&result);
                result
            }
            .instrument(Span::current()),
        )
    }

    /// Settles a request admitted by `decision` (of `caller`, made by this limiter) at what
    /// it turned out to cost, `actual`: the difference from the units it reserved is given
    /// back when it cost less, or charged when it cost more, once, where the reservation was
    /// counted (the store, the local share, or for a lease the store). A charge goes past the
    /// quota if need be: the caller is then in debt, and its later requests are refused
    /// until the debt has drained (their `t` and Retry-After cover it). An admitted request
    /// is never refused after the fact. So over any window a caller is charged at most its
    /// quota plus what one request cost beyond its reservation.
    ///
    /// Resolves to the [`Settlement`](crate::decision::Settlement) once the store has
    /// answered, or to the store's error; either way it is counted in
    /// `tollgate_settlements_total` (`exact`, `refunded`, `charged`, `failed`, or
    /// `not_counted` for a decision that counted nothing) and a failure is logged, so callers
    /// may ignore the result: what the store could not be told stays as reserved. Like a
    /// refund, each store call is bounded by the store timeout, and a refund drops the
    /// caller's cached refusal.
    ///
    /// Settle each decision at most once.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // 1,000 tokens a minute, all of them at once if need be.
    /// let tokens = Limiter::builder()
    ///     .policy(Policy::token_bucket("tokens", Quota::per_minute(1_000), 1_000))
    ///     .build();
    /// let acme = Caller::new("acme");
    /// // Reserved at 200 tokens; the answer used 1,150: 150 past the bucket.
    /// let admitted = tokens.check_cost(&acme, 200).await;
    /// let settled = tokens.settle(&acme, &admitted, 1_150).await.unwrap();
    /// assert_eq!(settled.charged(), 950);
    /// // In debt: refused, and told to wait until the 150 and one more have refilled
    /// // (151 tokens at 1,000 a minute: 9.06 s).
    /// let next = tokens.check(&acme).await;
    /// assert!(!next.is_allowed());
    /// assert_eq!(next.info().unwrap().retry_after_secs(), 10);
    /// # }
    /// ```
    pub fn settle(
        &self,
        caller: &Caller,
        decision: &Decision,
        actual: u64,
    ) -> StoreFuture<Result<Settlement, StoreError>> {
        let inner = &self.inner;
        let info = match decision {
            Decision::Allowed(info) => Some(info),
            Decision::Shadowed(would_be) => match would_be.as_ref() {
                Decision::Allowed(info) => Some(info),
                _ => None,
            },
            _ => None,
        };
        let counted = info
            .and_then(|info| Some((info, info.receipt()?)))
            .filter(|(info, _)| {
                matches!(
                    info.source(),
                    DecisionSource::Store | DecisionSource::Lease | DecisionSource::LocalShare
                )
            });
        let Some((info, receipt)) = counted else {
            inner.metrics.settle(SettleResult::NotCounted);
            return StoreFuture::ready(Ok(Settlement::not_counted(actual)));
        };
        let reserved = info.cost();
        let limits = info.policy_set();
        let original = caller;
        let counted_under = caller.counted_under();
        let caller = counted_under.as_ref().unwrap_or(caller);
        let mut settling: StoreFuture<Result<Settlement, StoreError>> = if actual == reserved {
            StoreFuture::ready(Ok(Settlement::new(reserved, actual, None)))
        } else if actual < reserved {
            let refund = Refund::new(reserved - actual, receipt.counted_at_ms);
            let set_id = self.set_id_now(original);
            let mut given_back = match info.source() {
                DecisionSource::LocalShare => {
                    StoreFuture::ready(inner.path.refund_share(caller, set_id, limits, refund))
                }
                _ => {
                    if receipt.shared {
                        inner.path.settle_share_too(caller, limits, Some(refund), 0);
                    }
                    inner.path.refund(caller, set_id, limits, refund)
                }
            };
            let settled = move |result: Result<(), StoreError>| {
                result.map(|()| Settlement::new(reserved, actual, None))
            };
            match given_back.try_take_ready() {
                Some(result) => StoreFuture::ready(settled(result)),
                None => StoreFuture::boxed(async move { settled(given_back.await) }),
            }
        } else {
            let units = actual - reserved;
            let mut charged = match info.source() {
                DecisionSource::LocalShare => {
                    StoreFuture::ready(Ok(inner.path.charge_share(caller, limits, units)))
                }
                _ => {
                    if receipt.shared {
                        inner.path.settle_share_too(caller, limits, None, units);
                    }
                    inner.path.charge(caller, limits, units)
                }
            };
            let settled = move |result: Result<CheckOutcome, StoreError>| {
                result.map(|after| Settlement::new(reserved, actual, Some(after)))
            };
            match charged.try_take_ready() {
                Some(result) => StoreFuture::ready(settled(result)),
                None => StoreFuture::boxed(async move { settled(charged.await) }),
            }
        };
        if let Some(result) = settling.try_take_ready() {
            inner.settled(&result);
            return StoreFuture::ready(result);
        }
        let inner = self.inner.clone();
        StoreFuture::boxed(
            async move {
                let result = settling.await;
                inner.settled(&result);
                result
            }
            .instrument(Span::current()),
        )
    }

    /// The identity of the policy set `caller` is decided against now: units given back
    /// make stale the refusal cached under it (a refusal cached under limits swapped out
    /// since is never read again).
    fn set_id_now(&self, caller: &Caller) -> u64 {
        let active = self.inner.limits.load();
        let set = active.for_caller(caller);
        match caller.counted_under() {
            None => set.id,
            Some(_) => active.nested(caller, &set).id,
        }
    }

    /// Switches this limiter and every clone of it between enforce, shadow and off, from
    /// the next decision on: from an admin endpoint or a configuration reload, without
    /// rebuilding the router. To switch several limiters together (a kill switch for a
    /// whole service), keep a clone of each and set each one.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota, reload::Mode};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
    ///     .build();
    /// let admin = limiter.clone();
    /// let acme = Caller::new("acme");
    /// assert!(limiter.check(&acme).await.is_allowed());
    /// assert!(!limiter.check(&acme).await.is_allowed());
    /// admin.set_mode(Mode::Shadow);
    /// assert!(limiter.check(&acme).await.is_allowed());
    /// assert_eq!(limiter.mode(), Mode::Shadow);
    /// # }
    /// ```
    pub fn set_mode(&self, mode: Mode) {
        self.inner.mode.set(mode);
    }

    /// The mode this limiter decides in.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Quota, reload::Mode};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .build();
    /// assert_eq!(limiter.mode(), Mode::Enforce);
    /// ```
    pub fn mode(&self) -> Mode {
        self.inner.mode.get()
    }

    /// Swaps `limits` in, or says why they cannot work and leaves the limits in force: the
    /// policies of this limiter, of its clones and of every layer built on it change without
    /// rebuilding the router. Keep a clone of the limiter (an admin endpoint's, a reload
    /// task's) to call it. Takes effect on the next decision; decisions already past reading
    /// the limits finish under the old ones.
    ///
    /// A new set is checked as [`LimiterBuilder::try_build`](crate::LimiterBuilder::try_build)
    /// checks one and swapped in whole, atomically: a decision is made entirely under the old
    /// limits or entirely under the new ones. An invalid set is refused with a [`BuildError`]
    /// and the limits in force stay as they were.
    ///
    /// # What happens to a caller's count
    ///
    /// A count belongs to a policy's [`counter`](crate::Policy::counter): the limiter's scope, the
    /// policy's name and the unit it counts in (the sliding window's length, or the token
    /// bucket's refill period). A policy that keeps its name, algorithm and unit keeps every
    /// caller's count, and the new quota applies to it: raising `per-second` from 50 to 100
    /// lets a caller that already used 50 this second take 50 more, not 100; lowering it to
    /// 30 refuses that caller until its count falls below 30. A policy with a new name, or
    /// another window, period or algorithm, is a new counter: callers start it from zero.
    /// Refusals the limiter remembered (its denial cache) are forgotten at the swap, so none
    /// made under the old limits outlives them.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota, reload::Limits};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(2)))
    ///     .build();
    /// let acme = Caller::new("acme");
    /// assert!(limiter.check(&acme).await.is_allowed());
    /// assert!(limiter.check(&acme).await.is_allowed());
    /// assert!(!limiter.check(&acme).await.is_allowed());
    ///
    /// // Same name, same window: acme keeps the 2 it used and gets 1 more.
    /// limiter
    ///     .set_limits(Limits::new().policy(Policy::sliding_window("per-minute", Quota::per_minute(3))))
    ///     .unwrap();
    /// assert!(limiter.check(&acme).await.is_allowed());
    /// assert!(!limiter.check(&acme).await.is_allowed());
    /// assert_eq!(limiter.policies()[0].quota(), 3);
    ///
    /// // A set that cannot work is refused, and the limits in force stay.
    /// assert!(limiter.set_limits(Limits::new()).is_err());
    /// assert_eq!(limiter.limits().policies()[0].quota(), 3);
    /// # }
    /// ```
    pub fn set_limits(&self, limits: Limits) -> Result<(), BuildError> {
        self.inner.limits.replace(limits)
    }

    /// The limits in force, as they were given (to the builder or to
    /// [`set_limits`](Self::set_limits)).
    pub fn limits(&self) -> Limits {
        self.inner.limits.load().source.clone()
    }

    /// The policies in force for callers without a tier, in order, counted under this
    /// limiter's scope.
    pub fn policies(&self) -> Arc<[Policy]> {
        self.inner.limits.load().default_set().limits.clone()
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
        self.inner.path.breaker_state()
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
        self.inner.path.breaker_states()
    }
}

impl Limiter {
    /// A limiter of these parts, as the builder assembled them.
    fn from_parts(
        name: Arc<str>,
        mode: ModeSwitch,
        limits: Arc<InForce>,
        metrics: Arc<LimiterMetrics>,
        path: Path,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                name,
                mode,
                limits,
                metrics,
                path,
            }),
        }
    }
}

#[cfg(test)]
impl Limiter {
    /// The remote path, for tests that look inside it.
    pub(in crate::limiter) fn remote_path(&self) -> Option<&Arc<path::remote::RemotePath>> {
        match &self.inner.path {
            Path::Remote(path) => Some(path),
            Path::Local(_) => None,
        }
    }
}

/// How a check concludes its decision: what the path that decides it concludes it with.
pub(in crate::limiter) struct Conclusion<'a> {
    limiter: &'a Limiter,
    mode: Mode,
    refusals: Refusals,
    span: Option<&'a Span>,
}

impl Conclusion<'_> {
    /// The decision `build` makes, of an answer that `admitted` or not by a set that
    /// `locks_out` or not, concluded: a plain admission (enforced, no span to record it
    /// on, one counter) is counted before it is built, so that it is built where the
    /// caller receives it; any other is concluded once built.
    #[inline(always)]
    pub(in crate::limiter) fn of(
        &self,
        admitted: bool,
        locks_out: bool,
        cost: u64,
        build: impl FnOnce() -> Decision,
    ) -> StoreFuture<Decision> {
        if admitted
            && self.mode == Mode::Enforce
            && self.span.is_none()
            && self.limiter.inner.metrics.plain_admission(cost, locks_out)
        {
            return StoreFuture::ready(build());
        }
        self.decision(build())
    }

    /// `decision`, concluded.
    #[inline]
    pub(in crate::limiter) fn decision(&self, mut decision: Decision) -> StoreFuture<Decision> {
        self.limiter
            .inner
            .conclude(&mut decision, self.mode, self.refusals, self.span);
        StoreFuture::ready(decision)
    }

    /// `answer`, concluded in place when it is known, when it comes otherwise.
    #[inline]
    pub(in crate::limiter) fn answer(
        &self,
        mut answer: StoreFuture<Decision>,
    ) -> StoreFuture<Decision> {
        match answer.ready_slot() {
            Some(Some(decision)) => {
                self.limiter
                    .inner
                    .conclude(decision, self.mode, self.refusals, self.span);
            }
            _ => {
                answer = self.limiter.conclude_later(
                    answer,
                    self.mode,
                    self.refusals,
                    self.span.cloned(),
                );
            }
        }
        answer
    }
}

impl Inner {
    /// Shadows the decision in shadow mode, then counts it and records it on its span:
    /// every decision of the limiter passes here, once. In place: the usual decision is
    /// neither moved in nor out (a moved decision is read back right after it was written,
    /// which stalls), only counted.
    #[inline]
    fn conclude(
        &self,
        decision: &mut Decision,
        mode: Mode,
        refusals: Refusals,
        span: Option<&Span>,
    ) {
        if mode == Mode::Shadow {
            let enforced = std::mem::replace(decision, Decision::Unlimited(UnlimitedReason::Off));
            *decision = Decision::Shadowed(Box::new(enforced));
        } else if refusals == Refusals::LetThrough && matches!(decision, Decision::Limited(_)) {
            // A soft limit lets through what the policies refuse (a cost no quota admits
            // included), never what a store that failed closed refuses.
            let refused = std::mem::replace(decision, Decision::Unlimited(UnlimitedReason::Off));
            if let Decision::Limited(info) = refused {
                *decision = Decision::SoftLimited(info);
            }
        }
        self.recorded(decision, span);
    }

    /// Counts `decision` and records it on its span.
    #[inline]
    fn recorded(&self, decision: &Decision, span: Option<&Span>) {
        self.metrics.decision(decision);
        telemetry::record_decision(span, decision);
        if let Decision::Limited(info) = decision {
            tracing::debug!(
                layer = %self.name,
                policy = info.violated().next().map(|p| p.name()).unwrap_or_default(),
                retry_after_secs = info.retry_after_secs(),
                "request refused"
            );
        }
    }

    /// Counts a settlement, and logs one that failed: never an error for the request, what
    /// was reserved stays counted.
    fn settled(&self, result: &Result<Settlement, StoreError>) {
        let kind = match result {
            Ok(settled) if settled.refunded() > 0 => SettleResult::Refunded,
            Ok(settled) if settled.charged() > 0 => SettleResult::Charged,
            Ok(_) => SettleResult::Exact,
            Err(error) => {
                tracing::warn!(layer = %self.name, %error, "could not settle a request's cost with the store");
                SettleResult::Failed
            }
        };
        self.metrics.settle(kind);
    }

    /// Counts a refund, and logs one that failed: never an error for the request, the
    /// units stay consumed, which is the stricter outcome.
    fn refunded(&self, result: &Result<(), StoreError>) {
        match result {
            Ok(()) => self.metrics.refund(true),
            Err(error) => {
                tracing::warn!(layer = %self.name, %error, "could not give units back to the store");
                self.metrics.refund(false);
            }
        }
    }
}

/// What a check does with a refusal by the policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusals {
    /// Refuses the request.
    Refuse,
    /// Lets it through as [`Decision::SoftLimited`].
    LetThrough,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.inner.name)
            .field("backend", &self.inner.path.store().backend())
            .field("limits", &self.inner.limits)
            .field("on_store_failure", self.inner.path.fallback().policy())
            .field("store_timeout", &self.inner.path.store().timeout())
            .field("breakers", &self.inner.path.breaker_states())
            .finish_non_exhaustive()
    }
}
