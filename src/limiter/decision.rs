//! What the limiter decided about one request.

use std::fmt;
use std::sync::Arc;

use crate::limiter::report_words::{Report, Terms};
use crate::limiter::reported_set::ReportedSet;
use crate::limiter::settlement::Settlement;
use crate::store::algorithm::PolicyOutcome;
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

    /// The decision of a store's answer, once what it reports is known.
    #[inline]
    pub(crate) fn answered(admitted: bool, info: RateLimitInfo) -> Self {
        if admitted {
            Decision::Allowed(info)
        } else {
            Decision::Limited(info)
        }
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
/// It refers to the policy set it reports on (never a copy) and holds the usual report
/// (one or two policies, numbers below 2^32) in three words, so a decision allocates
/// nothing for it and is cheap to move.
#[derive(Clone)]
pub struct RateLimitInfo {
    report: Report,
}

/// Whether a report carries a receipt, and whose counters it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Receipted {
    No = 0,
    Store = 1,
    StoreAndShare = 2,
}

/// What an admitted request consumed: enough to give it back to the store that counted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Receipt {
    /// When the store counted it, on the store's clock.
    pub(crate) counted_at_ms: u64,
    /// Whether this instance's local share counted it too (a caller decided by both while
    /// what the share counted in an outage still weighs): what is given back or charged
    /// goes to both.
    pub(crate) shared: bool,
}

impl Receipt {
    /// What an answer counted at `counted_at_ms` can give back to the counters that
    /// answered (these alone): nothing unless it admitted.
    #[inline(always)]
    pub(crate) fn of_admission(admitted: bool, counted_at_ms: u64) -> Option<Self> {
        admitted.then_some(Receipt {
            counted_at_ms,
            shared: false,
        })
    }
}

impl Receipted {
    /// The kind of `code` (`kind as u8`).
    fn of_code(code: u8) -> Self {
        const ALL: [Receipted; 3] = [Receipted::No, Receipted::Store, Receipted::StoreAndShare];
        ALL.get(usize::from(code)).copied().unwrap_or(Receipted::No)
    }
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

    /// The source of `code` (`source as u8`).
    fn of_code(code: u8) -> Self {
        const ALL: [DecisionSource; 5] = [
            DecisionSource::Store,
            DecisionSource::DenialCache,
            DecisionSource::LocalShare,
            DecisionSource::Lease,
            DecisionSource::Cost,
        ];
        ALL.get(usize::from(code))
            .copied()
            .unwrap_or(DecisionSource::Store)
    }
}

impl RateLimitInfo {
    /// Builds the report from the limits and a store's outcomes for them.
    #[cfg(test)]
    pub(crate) fn from_outcomes(
        limits: &Arc<[Policy]>,
        outcomes: &[PolicyOutcome],
        source: DecisionSource,
    ) -> Self {
        Self::of_store(limits.into(), outcomes, source, 1, None)
    }

    /// The report of a store's answer about a request of `cost` units, made in one step (a
    /// decision is built on every request: no intermediate copies).
    #[inline(always)]
    pub(crate) fn of_store(
        set: ReportedSet,
        outcomes: &[PolicyOutcome],
        source: DecisionSource,
        cost: u64,
        receipt: Option<Receipt>,
    ) -> Self {
        Self {
            report: Report::new(set, outcomes, terms(source, cost, receipt)),
        }
    }

    /// [`of_store`](Self::of_store) for the numbers of a set of one policy.
    #[inline(always)]
    pub(crate) fn of_store_one(
        set: ReportedSet,
        outcome: PolicyOutcome,
        source: DecisionSource,
        cost: u64,
        receipt: Option<Receipt>,
    ) -> Self {
        Self {
            report: Report::one(set, outcome, terms(source, cost, receipt)),
        }
    }

    /// The same report with each policy's numbers changed by `change` (given the policy's
    /// index) and its other fields `terms`.
    fn remade(&self, change: impl Fn(usize, &mut PolicyOutcome), terms: Terms) -> Self {
        let report = &self.report;
        let changed = |i| {
            let mut outcome = report.outcome_at(i);
            change(i, &mut outcome);
            outcome
        };
        let set = report.set();
        let report = match report.len() {
            1 => Report::new(set, &[changed(0)], terms),
            2 => Report::new(set, &[changed(0), changed(1)], terms),
            len => Report::new(set, &(0..len).map(changed).collect::<Vec<_>>(), terms),
        };
        Self { report }
    }

    /// The same report with its other fields changed by `change`.
    fn with_terms(self, change: impl FnOnce(&mut Terms)) -> Self {
        let mut terms = self.report.terms();
        change(&mut terms);
        self.remade(|_, _| {}, terms)
    }

    /// The same report, about a request of `cost` units.
    #[cfg(test)]
    pub(crate) fn for_cost(self, cost: u64) -> Self {
        self.with_terms(|terms| terms.cost = cost)
    }

    /// The same report once the request was settled: after a charge, what the store
    /// reported then; after a refund, what remained plus what came back (at most the
    /// quota), as far as this request knows.
    pub(crate) fn settled(&self, settlement: &Settlement) -> Self {
        let policies = self.report.policies();
        let after = settlement.after_charge().map(CheckOutcome::limits);
        let terms = Terms {
            cost: settlement.actual(),
            ..self.report.terms()
        };
        self.remade(
            |i, outcome| match after.and_then(|a| a.get(i)) {
                Some(after) => *outcome = *after,
                None => {
                    let quota = policies.get(i).map_or(u64::MAX, |p| p.algorithm().quota());
                    outcome.remaining = outcome
                        .remaining
                        .saturating_add(settlement.refunded())
                        .min(quota);
                    if outcome.remaining >= quota {
                        outcome.reset_ms = 0;
                    }
                }
            },
            terms,
        )
    }

    /// The same report, of an admission this instance's local share counted too.
    pub(crate) fn counted_by_share_too(self) -> Self {
        self.with_terms(|terms| {
            if terms.receipt == Receipted::Store as u8 {
                terms.receipt = Receipted::StoreAndShare as u8;
            }
        })
    }

    pub(crate) fn receipt(&self) -> Option<Receipt> {
        let terms = self.report.terms();
        let shared = match Receipted::of_code(terms.receipt) {
            Receipted::No => return None,
            Receipted::Store => false,
            Receipted::StoreAndShare => true,
        };
        Some(Receipt {
            counted_at_ms: terms.counted_at_ms,
            shared,
        })
    }

    /// Whether a policy of the set reported on locks callers out: the rare case that
    /// [`LimiterMetrics`](crate::limiter::telemetry::LimiterMetrics) looks further into.
    pub(crate) fn locks_out(&self) -> bool {
        self.report.set().locks_out()
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
        self.report.terms().cost
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
        if self.source() != DecisionSource::Cost {
            return None;
        }
        let cost = self.cost();
        self.policies().find(|p| p.quota() < cost)
    }

    /// The policy set this report is about.
    pub(crate) fn policy_set(&self) -> &Arc<[Policy]> {
        self.report.policies()
    }

    /// The same, as decisions hold it.
    pub(crate) fn reported_set(&self) -> ReportedSet {
        self.report.set()
    }

    /// Who decided: the store, the denial cache or the local share.
    pub fn source(&self) -> DecisionSource {
        DecisionSource::of_code(self.report.terms().source)
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
        let (report, set) = (&self.report, self.report.policies());
        (0..report.len().min(set.len())).map(move |i| PolicyReport {
            policy: &set[i],
            outcome: report.outcome_at(i),
        })
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
            policy: self.report.policies().get(index)?,
            outcome: self.report.outcome(index)?,
        })
    }

    /// The policies that refused the request.
    pub fn violated(&self) -> impl Iterator<Item = PolicyReport<'_>> + Clone + '_ {
        self.policies().filter(|p| p.is_exhausted())
    }

    /// The smallest `r` over all policies.
    pub fn min_remaining(&self) -> Option<u64> {
        self.report.outcomes().map(|o| o.remaining).min()
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
        if self.report.outcomes().all(|o| o.remaining > 0) {
            return None;
        }
        Some(self.remade(
            |_, o| o.admitted = o.remaining > 0,
            terms(DecisionSource::DenialCache, 1, None),
        ))
    }

    /// The same refusal seen `remaining_ms` before it ends, of a request of `cost` units:
    /// the exhausted policies wait that long (a cached denial, served later than it was
    /// made).
    pub(crate) fn waiting(&self, remaining_ms: u64, cost: u64) -> Self {
        self.remade(
            |_, o| {
                if !o.admitted {
                    o.reset_ms = remaining_ms;
                }
            },
            terms(DecisionSource::DenialCache, cost, None),
        )
    }
}

/// A report's fields other than its numbers.
#[inline(always)]
fn terms(source: DecisionSource, cost: u64, receipt: Option<Receipt>) -> Terms {
    let (receipt, counted_at_ms) = match receipt {
        None => (Receipted::No, 0),
        Some(Receipt {
            counted_at_ms,
            shared,
        }) => (
            if shared {
                Receipted::StoreAndShare
            } else {
                Receipted::Store
            },
            counted_at_ms,
        ),
    };
    Terms {
        source: source as u8,
        receipt: receipt as u8,
        counted_at_ms,
        cost,
    }
}

// Equal when they say the same, however they are held.
impl PartialEq for RateLimitInfo {
    fn eq(&self, other: &Self) -> bool {
        self.policy_set() == other.policy_set()
            && self.report.outcomes().eq(other.report.outcomes())
            && self.cost() == other.cost()
            && self.source() == other.source()
            && self.receipt() == other.receipt()
    }
}

impl Eq for RateLimitInfo {}

impl fmt::Debug for RateLimitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitInfo")
            .field("set", self.policy_set())
            .field("outcomes", &self.report.outcomes().collect::<Vec<_>>())
            .field("cost", &self.cost())
            .field("source", &self.source())
            .field("receipt", &self.receipt())
            .finish()
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
    fn a_decision_is_four_words_its_option_included() {
        assert_eq!(size_of::<RateLimitInfo>(), 24);
        assert_eq!(size_of::<Decision>(), 32);
        assert_eq!(size_of::<Option<Decision>>(), 32);
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
        let admitted = |counted_at_ms, shared| {
            RateLimitInfo::of_store(
                (&limits).into(),
                &last,
                DecisionSource::Store,
                1,
                Some(Receipt {
                    counted_at_ms,
                    shared,
                }),
            )
        };
        let (first, second) = (admitted(1_000, false), admitted(1_100, true));
        assert_ne!(first, second);
        assert_eq!(first.next_refusal(), second.next_refusal());
        assert_eq!(first.next_refusal().and_then(|r| r.receipt()), None);
        assert_eq!(
            first.next_refusal().map(|r| r.waiting(300, 1)),
            second.next_refusal().map(|r| r.waiting(300, 1))
        );
    }
}
