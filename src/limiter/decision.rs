//! What the limiter decided about one request.

use std::sync::Arc;

use crate::store::algorithm::PolicyOutcome;
use crate::store::policy::Policy;

/// The outcome of one request, put in the response's extensions for handlers and logs.
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
            Decision::Allowed(_) | Decision::Unlimited(_) | Decision::Shadowed(_)
        )
    }

    /// The per-policy details, when the store decided.
    pub fn info(&self) -> Option<&RateLimitInfo> {
        match self {
            Decision::Allowed(info) | Decision::Limited(info) => Some(info),
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitInfo {
    policies: Reports,
    source: DecisionSource,
    // The policy set reported on, shared: what the headers advertise depends on it alone,
    // so the HTTP floor can cache that part per set.
    set: Arc<[Policy]>,
    cost: u64,
    // What an admission consumed and where, so that it can be given back.
    receipt: Option<Receipt>,
}

/// The per-policy reports of one decision. One or two policies (the usual sets) are kept
/// inline, so a decision allocates nothing for its report; longer sets share one
/// allocation.
#[derive(Clone, Debug)]
enum Reports {
    One([PolicyReport; 1]),
    Two([PolicyReport; 2]),
    Many(Arc<[PolicyReport]>),
}

// Equal when the reports are, however they are held.
impl PartialEq for Reports {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Reports {}

impl Reports {
    fn as_slice(&self) -> &[PolicyReport] {
        match self {
            Reports::One(reports) => reports,
            Reports::Two(reports) => reports,
            Reports::Many(reports) => reports,
        }
    }

    /// The reports `make` builds for each of `count` positions, in order.
    fn build(count: usize, mut make: impl FnMut(usize) -> PolicyReport) -> Self {
        match count {
            1 => Reports::One([make(0)]),
            2 => Reports::Two([make(0), make(1)]),
            _ => Reports::Many((0..count).map(make).collect()),
        }
    }

    /// The same reports, each changed by `change`.
    fn map(&self, change: impl Fn(&mut PolicyReport)) -> Self {
        let reports = self.as_slice();
        Self::build(reports.len(), |i| {
            let mut report = reports[i].clone();
            change(&mut report);
            report
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
        let count = limits.len().min(outcomes.len());
        let policies = Reports::build(count, |i| {
            let (limit, outcome) = (&limits[i], &outcomes[i]);
            PolicyReport {
                name: limit.name_arc().clone(),
                quota: limit.algorithm().quota(),
                window_secs: whole_seconds(limit.algorithm().window_ms()),
                remaining: outcome.remaining,
                reset_ms: outcome.reset_ms,
                reset_secs: whole_seconds(outcome.reset_ms),
                exhausted: !outcome.admitted,
            }
        });
        Self {
            policies,
            source,
            set: limits.clone(),
            cost: 1,
            receipt: None,
        }
    }

    /// The same report, about a request of `cost` units.
    pub(crate) fn for_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The same report, of an admission that `receipt` can give back.
    pub(crate) fn with_receipt(mut self, receipt: Receipt) -> Self {
        self.receipt = Some(receipt);
        self
    }

    pub(crate) fn receipt(&self) -> Option<Receipt> {
        self.receipt
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
        self.receipt.map(|receipt| receipt.counted_at_ms)
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
    pub fn unaffordable(&self) -> Option<&PolicyReport> {
        if self.source != DecisionSource::Cost {
            return None;
        }
        self.policies().iter().find(|p| p.quota < self.cost)
    }

    /// The policy set this report is about.
    pub(crate) fn policy_set(&self) -> &Arc<[Policy]> {
        &self.set
    }

    /// Who decided: the store, the denial cache or the local share.
    pub fn source(&self) -> DecisionSource {
        self.source
    }

    /// Every policy's report.
    pub fn policies(&self) -> &[PolicyReport] {
        self.policies.as_slice()
    }

    /// The policies that refused the request.
    pub fn violated(&self) -> impl Iterator<Item = &PolicyReport> {
        self.policies().iter().filter(|p| p.exhausted)
    }

    /// The smallest `r` over all policies.
    pub fn min_remaining(&self) -> Option<u64> {
        self.policies().iter().map(|p| p.remaining).min()
    }

    /// Whole seconds until every refusing policy admits again (at least 1); never earlier
    /// than `t` of any exhausted policy. 0 when nothing refused.
    pub fn retry_after_secs(&self) -> u64 {
        self.violated().map(|p| p.reset_secs).max().unwrap_or(0)
    }

    /// Milliseconds until every refusing policy admits again; 0 when nothing refused.
    pub fn retry_after_ms(&self) -> u64 {
        self.violated().map(|p| p.reset_ms).max().unwrap_or(0)
    }

    /// The refusal the next request meets when this admission left a policy at `r=0`:
    /// those policies exhausted, until `r` grows again.
    pub(crate) fn next_refusal(&self) -> Option<Self> {
        if self.policies().iter().all(|p| p.remaining > 0) {
            return None;
        }
        let policies = self.policies.map(|p| p.exhausted = p.remaining == 0);
        Some(Self {
            policies,
            source: DecisionSource::DenialCache,
            set: self.set.clone(),
            cost: 1,
            receipt: None,
        })
    }

    /// The same refusal seen `remaining_ms` before it ends: the exhausted policies wait
    /// that long (a cached denial, served later than it was made).
    pub(crate) fn waiting(&self, remaining_ms: u64) -> Self {
        let policies = self.policies.map(|p| {
            if p.exhausted {
                p.reset_ms = remaining_ms;
                p.reset_secs = whole_seconds(remaining_ms);
            }
        });
        Self {
            policies,
            source: DecisionSource::DenialCache,
            set: self.set.clone(),
            cost: self.cost,
            receipt: None,
        }
    }
}

/// One policy's state as the headers report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyReport {
    name: Arc<str>,
    quota: u64,
    window_secs: u64,
    remaining: u64,
    reset_ms: u64,
    reset_secs: u64,
    exhausted: bool,
}

impl PolicyReport {
    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// `q`: the quota.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// `w`: the window in whole seconds, at least 1.
    pub fn window_secs(&self) -> u64 {
        self.window_secs
    }

    /// `r`: requests still admitted now.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// `t`: whole seconds until `r` grows (for an exhausted policy, until it admits again),
    /// at least 1.
    pub fn reset_secs(&self) -> u64 {
        self.reset_secs
    }

    /// Milliseconds until `r` grows, exactly as the store computed it.
    pub fn reset_ms(&self) -> u64 {
        self.reset_ms
    }

    /// Whether this policy refused the request.
    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }
}

/// Milliseconds rounded up to whole seconds, at least 1: a client told to wait must never
/// come back too early.
pub(crate) fn whole_seconds(millis: u64) -> u64 {
    millis.div_ceil(1_000).max(1)
}
