//! What the limiter decided about one request.

use std::sync::Arc;

use crate::limiter::reported_set::ReportedSet;
use crate::limiter::settlement::Settlement;
use crate::store::algorithm::{OutcomeWords, PolicyOutcome};
use crate::store::backend::{CheckOutcome, StoreError, StoreErrorKind};
use crate::store::domain::FailureDomain;
use crate::store::policy::Policy;

/// The outcome of one request, put in the response's extensions for outer middleware and
/// logs: a refusal's always, an admitted request's when the layer asks for it
/// ([`RateLimitLayer::decision_on_every_response`](crate::RateLimitLayer::decision_on_every_response)).
///
/// ```
/// use tollgate::Decision;
///
/// fn log(decision: &Decision) -> String {
///     match decision {
///         Decision::Allowed(info) => format!("allowed, {} left", info.min_remaining().unwrap_or(0)),
///         Decision::Limited(info) => format!("limited for {} s", info.retry_after_secs()),
///         Decision::Unavailable { retry_after_secs, .. } => format!("store down, retry in {retry_after_secs} s"),
///         Decision::Unlimited(reason) => format!("not counted: {}", reason.as_str()),
///         Decision::Shadowed(would_be) => format!("shadow mode; would have been {would_be:?}"),
///         // Decisions may gain kinds in later versions.
///         other => format!("{other:?}"),
///     }
/// }
/// # let _ = log;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
// The kind in a whole word: a decision is moved out of its future right after it was
// written, and with a one-byte kind that copy began at the second byte, so that every
// load straddled two of the stores before it and waited for them to land.
#[repr(u64)]
pub enum Decision {
    /// Every policy admitted the request.
    Allowed(RateLimitInfo),
    /// At least one policy refused it (429).
    Limited(RateLimitInfo),
    /// The store could not decide and the failure policy refuses (503 unless the layer
    /// says otherwise).
    #[non_exhaustive]
    Unavailable {
        /// Whole seconds, at least 1.
        retry_after_secs: u64,
        /// The caller's policies, every one refusing until the store is back: their
        /// capacity is reduced to nothing for now.
        policies: Arc<[Policy]>,
    },
    /// The request was let through without being counted.
    Unlimited(UnlimitedReason),
    /// Shadow mode: the request goes through whatever this decision (the one enforce mode
    /// would have made) says.
    Shadowed(Box<Decision>),
    /// A refusal that a soft limit lets through
    /// ([`RateLimitLayer::soft_limit`](crate::RateLimitLayer::soft_limit)): the request goes
    /// on with this in its extensions, so the handler can degrade (a cached answer, a
    /// smaller model), and counts nothing.
    SoftLimited(RateLimitInfo),
}

impl Decision {
    /// Whether the request goes on to the inner service.
    ///
    /// ```
    /// use tollgate::Decision;
    /// use tollgate::decision::UnlimitedReason;
    /// assert!(Decision::Unlimited(UnlimitedReason::NoKey).is_allowed());
    /// ```
    pub fn is_allowed(&self) -> bool {
        matches!(
            self,
            Decision::Allowed(_)
                | Decision::Unlimited(_)
                | Decision::Shadowed(_)
                | Decision::SoftLimited(_)
        )
    }

    /// The per-policy details, when the store decided.
    pub fn info(&self) -> Option<&RateLimitInfo> {
        match self {
            Decision::Allowed(info) | Decision::Limited(info) | Decision::SoftLimited(info) => {
                Some(info)
            }
            _ => None,
        }
    }
}

/// Why a request was let through uncounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnlimitedReason {
    /// The request had no key and the layer lets such requests pass.
    NoKey,
    /// The limiter is switched off.
    Off,
    /// The store failed and the failure policy fails open (or fails static and the
    /// caller had no cached refusal).
    StoreFailedOpen,
    /// The layer's skip predicate matched the request: no key was extracted and the
    /// store was not asked.
    Skipped,
}

impl UnlimitedReason {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            UnlimitedReason::NoKey => "no_key",
            UnlimitedReason::Off => "off",
            UnlimitedReason::StoreFailedOpen => "store_failed_open",
            UnlimitedReason::Skipped => "skipped",
        }
    }
}

/// The state of every policy after one decision, in the layer's policy order.
///
/// It holds the policy set it reports on (shared, not copied) and each policy's numbers
/// inline for the usual one or two policies, so a decision allocates nothing for its
/// report and copies no policy's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitInfo {
    // The policy set reported on, shared: what the headers advertise depends on it alone,
    // so the HTTP floor can cache that part per set.
    set: ReportedSet,
    outcomes: Outcomes,
    cost: u64,
    // What an admission consumed and where, so that it can be given back: its receipt's
    // numbers, whether there is one in `receipt`. Kept apart so that the report's small
    // fields share one word: a decision is moved on every request.
    counted_at_ms: u64,
    set_id: u64,
    source: DecisionSource,
    receipt: Receipted,
}

/// Whether a report carries a receipt, and whose counters it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Receipted {
    No,
    Store,
    StoreAndShare,
}

/// Each policy's numbers of one decision. One or two policies (the usual sets) are kept
/// inline; longer sets share one allocation.
#[derive(Clone, Debug)]
enum Outcomes {
    One([OutcomeWords; 1]),
    Two([OutcomeWords; 2]),
    Many(Arc<[OutcomeWords]>),
}

// Equal when the numbers are, however they are held.
impl PartialEq for Outcomes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Outcomes {}

impl Outcomes {
    fn as_slice(&self) -> &[OutcomeWords] {
        match self {
            Outcomes::One(outcomes) => outcomes,
            Outcomes::Two(outcomes) => outcomes,
            Outcomes::Many(outcomes) => outcomes,
        }
    }

    /// Each policy's outcome, in order.
    fn iter(&self) -> impl ExactSizeIterator<Item = PolicyOutcome> + Clone + '_ {
        self.as_slice().iter().map(|kept| kept.get())
    }

    fn get(&self, index: usize) -> Option<PolicyOutcome> {
        self.as_slice().get(index).map(|kept| kept.get())
    }

    /// The outcomes `make` builds for each of `count` positions, in order.
    #[inline]
    fn build(count: usize, mut make: impl FnMut(usize) -> PolicyOutcome) -> Self {
        // A wait of 2^63 ms or more (never computed) is kept as the longest that fits.
        let mut kept = |i| OutcomeWords::of(make(i), OutcomeWords::LONGEST_WAIT_MS);
        match count {
            1 => Outcomes::One([kept(0)]),
            2 => Outcomes::Two([kept(0), kept(1)]),
            _ => Outcomes::Many((0..count).map(kept).collect()),
        }
    }

    /// The same outcomes, each changed by `change`.
    fn map(&self, change: impl Fn(&mut PolicyOutcome)) -> Self {
        let outcomes = self.as_slice();
        Self::build(outcomes.len(), |i| {
            let mut outcome = outcomes[i].get();
            change(&mut outcome);
            outcome
        })
    }
}

/// What an admitted request consumed: enough to give it back to the store that counted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Receipt {
    /// When the store counted it, on the store's clock.
    pub(crate) counted_at_ms: u64,
    /// The identity of the policy set that counted it (for the denial cache).
    pub(crate) set_id: u64,
    /// Whether this instance's local share counted it too (a caller decided by both while
    /// what the share counted in an outage still weighs): what is given back or charged
    /// goes to both.
    pub(crate) shared: bool,
}

/// Who made a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecisionSource {
    /// The store (shared counters).
    Store,
    /// A refusal the store made earlier, cached until its retry time.
    DenialCache,
    /// This instance's share of the limit, while the store is down.
    LocalShare,
    /// A lease of the caller's quota taken from the store earlier (see
    /// [`LimiterBuilder::leases`](crate::LimiterBuilder::leases)).
    Lease,
    /// The request's cost exceeds a policy's quota, so no wait would ever admit it: refused
    /// without asking the store. `r` and `t` are not known and reported as 0.
    Cost,
}

impl DecisionSource {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            DecisionSource::Store => "store",
            DecisionSource::DenialCache => "denial_cache",
            DecisionSource::LocalShare => "local_share",
            DecisionSource::Lease => "lease",
            DecisionSource::Cost => "cost",
        }
    }
}

impl RateLimitInfo {
    /// Builds the report from the limits and a store's outcomes for them.
    pub(crate) fn from_outcomes(
        limits: &Arc<[Policy]>,
        outcomes: &[PolicyOutcome],
        source: DecisionSource,
    ) -> Self {
        Self::from_set(limits.into(), outcomes, source)
    }

    /// [`from_outcomes`](Self::from_outcomes) for a set as decisions hold it.
    pub(crate) fn from_set(
        set: ReportedSet,
        outcomes: &[PolicyOutcome],
        source: DecisionSource,
    ) -> Self {
        Self::of_store(set, outcomes, source, 1, None)
    }

    /// The report of a store's answer about a request of `cost` units, made in one step (a
    /// decision is built on every request: no intermediate copies).
    #[inline]
    pub(crate) fn of_store(
        set: ReportedSet,
        outcomes: &[PolicyOutcome],
        source: DecisionSource,
        cost: u64,
        receipt: Option<Receipt>,
    ) -> Self {
        let count = set.get().len().min(outcomes.len());
        let outcomes = Outcomes::build(count, |i| outcomes[i]);
        Self::without_receipt(set, outcomes, source, cost).with_optional_receipt(receipt)
    }

    /// A report that gives nothing back: its receipt's numbers are zero, so that reports
    /// equal in what they say compare equal.
    #[inline]
    fn without_receipt(
        set: ReportedSet,
        outcomes: Outcomes,
        source: DecisionSource,
        cost: u64,
    ) -> Self {
        Self {
            set,
            outcomes,
            cost,
            counted_at_ms: 0,
            set_id: 0,
            source,
            receipt: Receipted::No,
        }
    }

    /// The same report, about a request of `cost` units.
    pub(crate) fn for_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The same report once the request was settled: after a charge, what the store
    /// reported then; after a refund, what remained plus what came back (at most the
    /// quota), as far as this request knows.
    pub(crate) fn settled(&self, settlement: &Settlement) -> Self {
        let before = self.outcomes.as_slice();
        let policies = self.set.get();
        let after = settlement.after_charge().map(CheckOutcome::limits);
        let outcomes = Outcomes::build(before.len(), |i| match after.and_then(|a| a.get(i)) {
            Some(after) => *after,
            None => {
                let quota = policies.get(i).map_or(u64::MAX, |p| p.algorithm().quota());
                let mut outcome = before[i].get();
                outcome.remaining = outcome
                    .remaining
                    .saturating_add(settlement.refunded())
                    .min(quota);
                if outcome.remaining >= quota {
                    outcome.reset_ms = 0;
                }
                outcome
            }
        });
        Self {
            set: self.set.clone(),
            outcomes,
            cost: settlement.actual(),
            counted_at_ms: self.counted_at_ms,
            set_id: self.set_id,
            source: self.source,
            receipt: self.receipt,
        }
    }

    /// The same report, of an admission this instance's local share counted too.
    pub(crate) fn counted_by_share_too(mut self) -> Self {
        if self.receipt == Receipted::Store {
            self.receipt = Receipted::StoreAndShare;
        }
        self
    }

    /// The same report, of an admission that `receipt` can give back.
    pub(crate) fn with_receipt(self, receipt: Receipt) -> Self {
        self.with_optional_receipt(Some(receipt))
    }

    #[inline]
    fn with_optional_receipt(mut self, receipt: Option<Receipt>) -> Self {
        match receipt {
            Some(receipt) => {
                self.counted_at_ms = receipt.counted_at_ms;
                self.set_id = receipt.set_id;
                self.receipt = if receipt.shared {
                    Receipted::StoreAndShare
                } else {
                    Receipted::Store
                };
            }
            None => {
                self.counted_at_ms = 0;
                self.set_id = 0;
                self.receipt = Receipted::No;
            }
        }
        self
    }

    pub(crate) fn receipt(&self) -> Option<Receipt> {
        let shared = match self.receipt {
            Receipted::No => return None,
            Receipted::Store => false,
            Receipted::StoreAndShare => true,
        };
        Some(Receipt {
            counted_at_ms: self.counted_at_ms,
            set_id: self.set_id,
            shared,
        })
    }

    /// Whether a policy of the set reported on locks callers out: the rare case that
    /// [`LimiterMetrics`](crate::limiter::telemetry::LimiterMetrics) looks further into.
    pub(crate) fn locks_out(&self) -> bool {
        self.set.locks_out()
    }

    /// When the store counted what this admission consumed, on the store's clock (ms
    /// since the epoch): for a decision made from a lease, when the lease was taken.
    /// `None` for a decision that counted nothing (a refusal, a request let through
    /// while the store was down).
    ///
    /// ```
    /// use tollgate::{Caller, Decision, Limiter, Policy, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
    ///     .build();
    /// let acme = Caller::new("acme");
    /// let Decision::Allowed(info) = limiter.check(&acme).await else { panic!() };
    /// assert!(info.counted_at_ms().is_some());
    /// let Decision::Limited(info) = limiter.check(&acme).await else { panic!() };
    /// assert_eq!(info.counted_at_ms(), None);
    /// # }
    /// ```
    pub fn counted_at_ms(&self) -> Option<u64> {
        self.receipt().map(|receipt| receipt.counted_at_ms)
    }

    /// The units the request cost (1 unless the layer or the caller of
    /// [`Limiter::check_cost`](crate::Limiter::check_cost) said otherwise).
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("items", Quota::per_second(50)))
    ///     .build();
    /// let decision = limiter.check_cost(&Caller::new("acme"), 30).await;
    /// assert_eq!(decision.info().map(|info| info.cost()), Some(30));
    /// # }
    /// ```
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// For a refusal because the request's cost exceeds a quota
    /// ([`DecisionSource::Cost`]), the first policy whose quota is below the cost: one no
    /// wait would ever make admit the request. (While a local share decides, a cost above
    /// the share's smaller quota is an ordinary refusal: it fits again once the store is
    /// back.)
    ///
    /// ```
    /// use tollgate::{Caller, Decision, Limiter, Policy, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .build();
    /// let Decision::Limited(info) = limiter.check_cost(&Caller::new("acme"), 60).await else {
    ///     panic!("60 units never fit in 50");
    /// };
    /// assert_eq!(info.unaffordable().map(|p| p.name()), Some("per-second"));
    /// # }
    /// ```
    pub fn unaffordable(&self) -> Option<PolicyReport<'_>> {
        if self.source != DecisionSource::Cost {
            return None;
        }
        self.policies().find(|p| p.quota() < self.cost)
    }

    /// The policy set this report is about.
    pub(crate) fn policy_set(&self) -> &Arc<[Policy]> {
        self.set.get()
    }

    /// The same, as this report holds it.
    pub(crate) fn reported_set(&self) -> &ReportedSet {
        &self.set
    }

    /// Who decided: the store, the denial cache or the local share.
    pub fn source(&self) -> DecisionSource {
        self.source
    }

    /// Every policy's report, in the set's order.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .policy(Policy::sliding_window("per-day", Quota::per_day(1_000_000)))
    ///     .build();
    /// let decision = limiter.check(&Caller::new("acme")).await;
    /// let info = decision.info().expect("the store decided");
    /// let left: Vec<(&str, u64)> = info.policies().map(|p| (p.name(), p.remaining())).collect();
    /// assert_eq!(left, [("per-second", 49), ("per-day", 999_999)]);
    /// # }
    /// ```
    pub fn policies(&self) -> impl ExactSizeIterator<Item = PolicyReport<'_>> + Clone + '_ {
        self.set
            .get()
            .iter()
            .zip(self.outcomes.iter())
            .map(|(policy, outcome)| PolicyReport { policy, outcome })
    }

    /// The report of the policy at `index` in the set, if there is one.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .build();
    /// let decision = limiter.check(&Caller::new("acme")).await;
    /// let info = decision.info().expect("the store decided");
    /// assert_eq!(info.policy(0).map(|p| p.quota()), Some(50));
    /// assert!(info.policy(1).is_none());
    /// # }
    /// ```
    pub fn policy(&self, index: usize) -> Option<PolicyReport<'_>> {
        Some(PolicyReport {
            policy: self.set.get().get(index)?,
            outcome: self.outcomes.get(index)?,
        })
    }

    /// The policies that refused the request.
    pub fn violated(&self) -> impl Iterator<Item = PolicyReport<'_>> + Clone + '_ {
        self.policies().filter(|p| p.is_exhausted())
    }

    /// The smallest `r` over all policies.
    pub fn min_remaining(&self) -> Option<u64> {
        self.outcomes.iter().map(|o| o.remaining).min()
    }

    /// Whole seconds until every refusing policy admits again (at least 1); never earlier
    /// than `t` of any exhausted policy. 0 when nothing refused.
    pub fn retry_after_secs(&self) -> u64 {
        self.violated().map(|p| p.reset_secs()).max().unwrap_or(0)
    }

    /// Milliseconds until every refusing policy admits again; 0 when nothing refused.
    pub fn retry_after_ms(&self) -> u64 {
        self.violated().map(|p| p.reset_ms()).max().unwrap_or(0)
    }

    /// The refusal the next request meets when this admission left a policy at `r=0`:
    /// those policies exhausted, until `r` grows again.
    pub(crate) fn next_refusal(&self) -> Option<Self> {
        if self.outcomes.iter().all(|o| o.remaining > 0) {
            return None;
        }
        let outcomes = self.outcomes.map(|o| o.admitted = o.remaining > 0);
        Some(Self::without_receipt(
            self.set.clone(),
            outcomes,
            DecisionSource::DenialCache,
            1,
        ))
    }

    /// The same refusal seen `remaining_ms` before it ends: the exhausted policies wait
    /// that long (a cached denial, served later than it was made).
    pub(crate) fn waiting(&self, remaining_ms: u64) -> Self {
        let outcomes = self.outcomes.map(|o| {
            if !o.admitted {
                o.reset_ms = remaining_ms;
            }
        });
        Self::without_receipt(
            self.set.clone(),
            outcomes,
            DecisionSource::DenialCache,
            self.cost,
        )
    }
}

/// One policy's state as the headers report it: the policy, borrowed from the report's
/// set, and its numbers after the decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyReport<'a> {
    policy: &'a Policy,
    outcome: PolicyOutcome,
}

impl<'a> PolicyReport<'a> {
    /// The policy's name.
    pub fn name(&self) -> &'a str {
        self.policy.name()
    }

    /// The policy reported on.
    pub fn policy(&self) -> &'a Policy {
        self.policy
    }

    /// `q`: the quota.
    pub fn quota(&self) -> u64 {
        self.policy.algorithm().quota()
    }

    /// `w`: the window in whole seconds, at least 1.
    pub fn window_secs(&self) -> u64 {
        whole_seconds(self.policy.window_ms())
    }

    /// `r`: requests still admitted now.
    pub fn remaining(&self) -> u64 {
        self.outcome.remaining
    }

    /// `t`: whole seconds until `r` grows (for an exhausted policy, until it admits again),
    /// at least 1.
    pub fn reset_secs(&self) -> u64 {
        whole_seconds(self.outcome.reset_ms)
    }

    /// Milliseconds until `r` grows, exactly as the store computed it.
    pub fn reset_ms(&self) -> u64 {
        self.outcome.reset_ms
    }

    /// Whether this policy refused the request.
    pub fn is_exhausted(&self) -> bool {
        !self.outcome.admitted
    }
}

/// Milliseconds rounded up to whole seconds, at least 1: a client told to wait must never
/// come back too early.
pub(crate) fn whole_seconds(millis: u64) -> u64 {
    millis.div_ceil(1_000).max(1)
}

/// Why a decision fell back to the failure policy: the `reason` label of
/// `tollgate_fallbacks_total`, which no decision carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum FallbackReason {
    /// The store did not answer within the store timeout.
    Timeout,
    /// The store refused or dropped the connection (a call failed so, or the latest
    /// attempt to connect was refused and the store was not asked).
    Refused,
    /// The store answered with an error.
    OtherError,
    /// The breaker is open: the store was not asked.
    BreakerOpen,
    /// The store has no connection yet (it is being made, or made again): it was not
    /// asked.
    NotConnected,
}

impl FallbackReason {
    /// A short, stable name for logs and metric labels.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            FallbackReason::Timeout => "timeout",
            FallbackReason::Refused => "refused",
            FallbackReason::OtherError => "other_error",
            FallbackReason::BreakerOpen => "breaker_open",
            FallbackReason::NotConnected => "not_connected",
        }
    }

    /// The reason of a decision that did not call the store because `domain` has no
    /// connection.
    pub(crate) fn without_a_connection(domain: FailureDomain) -> Self {
        if domain.is_refused() {
            FallbackReason::Refused
        } else {
            FallbackReason::NotConnected
        }
    }

    pub(crate) fn of(error: &StoreError) -> Self {
        match error.kind() {
            StoreErrorKind::Timeout => FallbackReason::Timeout,
            StoreErrorKind::Unavailable => FallbackReason::Refused,
            StoreErrorKind::NotConnected => FallbackReason::NotConnected,
            StoreErrorKind::Other => FallbackReason::OtherError,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::algorithm::Algorithm;

    #[test]
    fn a_decision_is_twelve_words_its_option_included() {
        assert_eq!(size_of::<Decision>(), 96);
        assert_eq!(size_of::<Option<Decision>>(), 96);
    }

    #[test]
    fn reports_that_say_the_same_compare_equal_whatever_counted_them() {
        let limits: Arc<[Policy]> = Arc::from([Policy::new(
            "per-second",
            Algorithm::sliding_window(2, Duration::from_secs(1)),
        )]);
        let last = [PolicyOutcome {
            admitted: true,
            remaining: 0,
            reset_ms: 400,
        }];
        let admitted = |counted_at_ms, set_id| {
            RateLimitInfo::of_store(
                (&limits).into(),
                &last,
                DecisionSource::Store,
                1,
                Some(Receipt {
                    counted_at_ms,
                    set_id,
                    shared: false,
                }),
            )
        };
        let (first, second) = (admitted(1_000, 7), admitted(1_100, 8));
        assert_ne!(first, second);
        assert_eq!(first.next_refusal(), second.next_refusal());
        assert_eq!(first.next_refusal().and_then(|r| r.receipt()), None);
        assert_eq!(
            first.next_refusal().map(|r| r.waiting(300)),
            second.next_refusal().map(|r| r.waiting(300))
        );
    }
}
