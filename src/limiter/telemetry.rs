//! Every metric tollgate records, in one place (the table is in the crate docs).
//!
//! Label values are the layer's name, policy names, outcomes and reasons: never a caller
//! key, which is untrusted input of unbounded cardinality. The handles are registered once,
//! when a limiter is built, so recording a decision costs an atomic add, not a key lookup.
//! Building a limiter also describes its metrics (help text and unit) to the recorder then
//! installed, so a Prometheus scrape carries `# HELP` lines. A recorder installed after the
//! limiter was built never sees its metrics: the first decision compares the recorder in
//! force with the one at build time and logs one warning when they differ, so that the
//! mistake is not silent.
//!
//! Each decision also gets a `tracing` span, `tollgate.decision` at debug level: `layer`,
//! then `outcome` and `policy` once known. With no subscriber interested in it the span is
//! [`Span::none`], which costs no allocation and no field formatting.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics::{Counter, Gauge, Histogram, SharedString, Unit};
use tracing::Span;

use crate::limiter::decision::FallbackReason;
use crate::limiter::decision::{Decision, RateLimitInfo, UnlimitedReason};

pub(crate) const DECISIONS: &str = "tollgate_decisions_total";
pub(crate) const FALLBACKS: &str = "tollgate_fallbacks_total";
pub(crate) const BREAKER_STATE: &str = "tollgate_breaker_state";
pub(crate) const STORE_LATENCY: &str = "tollgate_store_latency_seconds";
pub(crate) const DENIAL_CACHE_HITS: &str = "tollgate_denial_cache_hits_total";
pub(crate) const REFUNDS: &str = "tollgate_refunds_total";
pub(crate) const SETTLEMENTS: &str = "tollgate_settlements_total";
pub(crate) const LOCKOUTS: &str = "tollgate_lockouts_total";

/// Describes the limiter's metrics (help text and unit) to the recorder installed now.
/// Called each time a limiter is built rather than once per process, so a recorder
/// installed after the first limiter, or a test's local one, gets the descriptions too;
/// describing a metric again replaces its description with the same text.
fn describe() {
    metrics::describe_counter!(
        DECISIONS,
        Unit::Count,
        "Rate-limit decisions, by layer, outcome (allowed, limited, unavailable, unlimited, \
         skipped, soft_limited for a refusal a soft limit let through, or shadow_* in shadow \
         mode) and, for refusals, the first refusing policy."
    );
    metrics::describe_counter!(
        FALLBACKS,
        Unit::Count,
        "Decisions the store could not make, by layer, reason (timeout, refused, other_error, \
         breaker_open, not_connected), the failure policy applied instead, and node (the part \
         of the store, such as a cluster master's address)."
    );
    metrics::describe_gauge!(
        BREAKER_STATE,
        "State of the circuit breaker in front of each part of the store, by layer and node \
         (a cluster master's address): 0 closed, 1 open, 2 half-open."
    );
    metrics::describe_histogram!(
        STORE_LATENCY,
        Unit::Seconds,
        "Duration of each call made to a remote store (decisions, leases, refunds and lease \
         give-backs), by layer, from start to answer, error or timeout."
    );
    metrics::describe_counter!(
        DENIAL_CACHE_HITS,
        Unit::Count,
        "Refusals served from the denial cache without a store call, by layer."
    );
    metrics::describe_counter!(
        REFUNDS,
        Unit::Count,
        "Admitted requests whose units were given back because they did not count, by layer \
         and result (given_back, or failed when the store could not take them back)."
    );
    metrics::describe_counter!(
        SETTLEMENTS,
        Unit::Count,
        "Admitted requests settled at what their responses cost, by layer and result (exact, \
         refunded when they cost less than they reserved, charged when they cost more, failed \
         when the store could not be told, not_counted when nothing had been counted)."
    );
    metrics::describe_counter!(
        LOCKOUTS,
        Unit::Count,
        "Blocks started by a policy's lockout (a caller used the quota up and is refused for \
         the lockout's duration), by layer and policy."
    );
}

/// The `outcome` of a decision, as the decisions counter and the decision span name it.
pub(crate) fn outcome(decision: &Decision) -> &'static str {
    match decision {
        Decision::Allowed(_) => "allowed",
        Decision::Limited(_) => "limited",
        Decision::SoftLimited(_) => "soft_limited",
        Decision::Unavailable { .. } => "unavailable",
        Decision::Unlimited(UnlimitedReason::Skipped) => "skipped",
        Decision::Unlimited(_) => "unlimited",
        Decision::Shadowed(inner) => match **inner {
            Decision::Limited(_) => "shadow_limited",
            Decision::Unavailable { .. } => "shadow_unavailable",
            Decision::Unlimited(_) => "shadow_unlimited",
            _ => "shadow_allowed",
        },
    }
}

/// The first policy that refused `decision` (or would have, in shadow mode).
fn refusing_policy(decision: &Decision) -> Option<&str> {
    let limited = match decision {
        Decision::Shadowed(inner) => inner.as_ref(),
        other => other,
    };
    match limited {
        Decision::Limited(info) | Decision::SoftLimited(info) => {
            info.violated().next().map(|policy| policy.name())
        }
        _ => None,
    }
}

/// A decision's span for limiter `layer`, its outcome and policy left to
/// [`record_decision`]: `None` unless a subscriber wants it (no span to make and drop per
/// decision, which costs a fair share of an in-process one); the fields are only
/// evaluated if one does.
#[inline]
pub(crate) fn decision_span(layer: &str) -> Option<Span> {
    // With no subscriber at debug level, return before the span macro: it would still
    // walk the fields for the `log` crate (tracing's `log` feature, which axum enables).
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return None;
    }
    debug_span(layer)
}

#[cold]
fn debug_span(layer: &str) -> Option<Span> {
    let span = tracing::debug_span!(
        "tollgate.decision",
        layer,
        outcome = tracing::field::Empty,
        policy = tracing::field::Empty,
    );
    (!span.is_disabled()).then_some(span)
}

/// Records the outcome of `decision`, and the refusing policy if there is one, on `span`.
#[inline]
pub(crate) fn record_decision(span: Option<&Span>, decision: &Decision) {
    if let Some(span) = span {
        record_on(span, decision);
    }
}

#[cold]
fn record_on(span: &Span, decision: &Decision) {
    span.record("outcome", outcome(decision));
    if let Some(policy) = refusing_policy(decision) {
        span.record("policy", policy);
    }
}

const REASONS: [FallbackReason; 5] = [
    FallbackReason::Timeout,
    FallbackReason::Refused,
    FallbackReason::OtherError,
    FallbackReason::BreakerOpen,
    FallbackReason::NotConnected,
];

/// One failure domain's fallback counters, one per reason.
pub(crate) struct FallbackCounters([Counter; REASONS.len()]);

impl FallbackCounters {
    /// The counters of limiter `layer` applying `failure_policy`, for the failure domain
    /// labelled `node`.
    pub(crate) fn new(layer: &Arc<str>, failure_policy: &'static str, node: &Arc<str>) -> Self {
        Self(REASONS.map(|reason| {
            metrics::counter!(
                FALLBACKS,
                "layer" => SharedString::from_shared(layer.clone()),
                "reason" => reason.as_str(),
                "policy" => failure_policy,
                "node" => SharedString::from_shared(node.clone()),
            )
        }))
    }

    pub(crate) fn count(&self, reason: FallbackReason) {
        let index = REASONS.iter().position(|r| *r == reason).unwrap_or(0);
        self.0[index].increment(1);
    }
}

/// Outcomes that carry no policy label.
#[derive(Clone, Copy)]
enum Plain {
    Allowed,
    Unavailable,
    Unlimited,
    ShadowAllowed,
    ShadowUnavailable,
    ShadowUnlimited,
}

const PLAIN: [(Plain, &str); 6] = [
    (Plain::Allowed, "allowed"),
    (Plain::Unavailable, "unavailable"),
    (Plain::Unlimited, "unlimited"),
    (Plain::ShadowAllowed, "shadow_allowed"),
    (Plain::ShadowUnavailable, "shadow_unavailable"),
    (Plain::ShadowUnlimited, "shadow_unlimited"),
];

/// One limiter's metric handles.
pub(crate) struct LimiterMetrics {
    layer: SharedString,
    plain: [Counter; 6],
    /// `limited`, `shadow_limited` and `soft_limited` by refusing policy: every name the
    /// limiter has enforced, those of swapped-out limits included (a decision made under
    /// them may still be counted after the swap).
    limited: ArcSwap<HashMap<Arc<str>, [Counter; 3]>>,
    denial_cache_hits: Counter,
    store_latency: Histogram,
    /// Refunds given back, and refunds that failed.
    refunds: [Counter; 2],
    /// Settlements, by [`SettleResult`].
    settlements: [Counter; 5],
    /// The recorder the handles were registered with (see [`recorder_in_force`]).
    recorder: usize,
    /// Whether a decision has compared `recorder` with the recorder in force.
    recorder_checked: AtomicBool,
}

/// The address of the recorder in force on this thread (a local one, the global one, or
/// metrics' no-op recorder): enough to tell that another one was installed since. (A
/// zero-sized recorder may share the no-op one's address: then nothing is told.)
fn recorder_in_force() -> usize {
    metrics::with_recorder(|recorder| {
        (recorder as *const dyn metrics::Recorder)
            .cast::<()>()
            .addr()
    })
}

/// The `limited`, `shadow_limited` and `soft_limited` counters of refusals by `policy`.
fn limited_counters(layer: &SharedString, policy: &Arc<str>) -> [Counter; 3] {
    let label = || SharedString::from_shared(policy.clone());
    [
        decision_counter(layer, "limited", label()),
        decision_counter(layer, "shadow_limited", label()),
        decision_counter(layer, "soft_limited", label()),
    ]
}

fn decision_counter(layer: &SharedString, outcome: &'static str, policy: SharedString) -> Counter {
    metrics::counter!(DECISIONS, "layer" => layer.clone(), "outcome" => outcome, "policy" => policy)
}

impl LimiterMetrics {
    /// Registers the handles of limiter `name`, whose policies are named `policies` (the
    /// fallbacks are counted per failure domain, by [`FallbackCounters`]).
    pub(crate) fn new(name: &Arc<str>, policies: impl IntoIterator<Item = Arc<str>>) -> Self {
        describe();
        let layer = SharedString::from_shared(name.clone());
        let limited = policies
            .into_iter()
            .map(|policy| {
                let counters = limited_counters(&layer, &policy);
                (policy, counters)
            })
            .collect();
        Self {
            layer: layer.clone(),
            plain: PLAIN
                .map(|(_, outcome)| decision_counter(&layer, outcome, SharedString::const_str(""))),
            limited: ArcSwap::from_pointee(limited),
            denial_cache_hits: metrics::counter!(DENIAL_CACHE_HITS, "layer" => layer.clone()),
            refunds: ["given_back", "failed"].map(
                |result| metrics::counter!(REFUNDS, "layer" => layer.clone(), "result" => result),
            ),
            settlements: SettleResult::ALL.map(|result| {
                metrics::counter!(SETTLEMENTS, "layer" => layer.clone(), "result" => result.as_str())
            }),
            store_latency: metrics::histogram!(STORE_LATENCY, "layer" => layer),
            recorder: recorder_in_force(),
            recorder_checked: AtomicBool::new(false),
        }
    }

    /// Once, at the first decision: warns when the recorder in force is not the one the
    /// handles were registered with, which is where this limiter's metrics still go.
    #[cold]
    fn check_recorder(&self) {
        if self.recorder_checked.swap(true, Ordering::Relaxed) {
            return;
        }
        if recorder_in_force() != self.recorder {
            tracing::warn!(
                layer = %self.layer,
                "this limiter's metrics go to the metrics recorder that was in force when it \
                 was built (none, if no recorder was installed yet), not to the one in force \
                 now: install the recorder before building limiters and layers"
            );
        }
    }

    /// Registers the `limited` counters of policies named `policies` that have none yet:
    /// the names of limits about to be swapped in.
    pub(crate) fn register_policies(&self, policies: impl IntoIterator<Item = Arc<str>>) {
        let new: Vec<Arc<str>> = policies
            .into_iter()
            .filter(|policy| !self.limited.load().contains_key(policy))
            .collect();
        if new.is_empty() {
            return;
        }
        self.limited.rcu(|known| {
            let mut known = HashMap::clone(known);
            for policy in &new {
                known
                    .entry((*policy).clone())
                    .or_insert_with(|| limited_counters(&self.layer, policy));
            }
            known
        });
    }

    /// One decision, by outcome and (for refusals) the first refusing policy. Inlined for
    /// the usual admission: one counter, no call.
    #[inline]
    pub(crate) fn decision(&self, decision: &Decision) {
        if let Decision::Allowed(info) = decision
            && self.plain_admission(info.cost(), info.locks_out())
        {
            return;
        }
        self.any_decision(decision);
    }

    /// Counts an admission of `cost` units by a set that locks out or not, when one
    /// counter is all it takes (the recorder is known and no lockout can start): `false`,
    /// counting nothing, otherwise. Read before the decision is built, so that one it
    /// counts is not read back.
    #[inline]
    pub(crate) fn plain_admission(&self, cost: u64, locks_out: bool) -> bool {
        if self.recorder_checked.load(Ordering::Relaxed) && !(cost > 0 && locks_out) {
            self.plain[Plain::Allowed as usize].increment(1);
            return true;
        }
        false
    }

    /// [`decision`](Self::decision), whatever it is.
    #[inline(never)]
    fn any_decision(&self, decision: &Decision) {
        if !self.recorder_checked.load(Ordering::Relaxed) {
            self.check_recorder();
        }
        let plain = |which: Plain| self.plain[which as usize].increment(1);
        let limited = |decision: &Decision, shadow: usize| {
            if let Some(policy) = decision.info().and_then(|info| info.violated().next())
                && let Some(counters) = self.limited.load().get(policy.policy().name_arc())
            {
                counters[shadow].increment(1);
            }
        };
        let admitted = match decision {
            Decision::Shadowed(inner) => inner.as_ref(),
            other => other,
        };
        if let Decision::Allowed(info) = admitted
            && info.cost() > 0
            && info.locks_out()
        {
            self.lockouts(info);
        }
        match decision {
            Decision::Allowed(_) => plain(Plain::Allowed),
            Decision::Limited(_) => limited(decision, 0),
            Decision::SoftLimited(_) => limited(decision, 2),
            Decision::Unavailable { .. } => plain(Plain::Unavailable),
            Decision::Unlimited(_) => plain(Plain::Unlimited),
            Decision::Shadowed(inner) => match **inner {
                Decision::Limited(_) => limited(inner, 1),
                Decision::Unavailable { .. } => plain(Plain::ShadowUnavailable),
                Decision::Unlimited(_) => plain(Plain::ShadowUnlimited),
                _ => plain(Plain::ShadowAllowed),
            },
        }
    }

    /// Counts the blocks an admission started: one per locking policy it left with
    /// nothing remaining (the store starts a block exactly then). Rare, so the handle is
    /// looked up when needed rather than held for every policy.
    fn lockouts(&self, info: &RateLimitInfo) {
        for policy in info.policies() {
            if policy.policy().lockout().is_some() && policy.remaining() == 0 {
                metrics::counter!(
                    LOCKOUTS,
                    "layer" => self.layer.clone(),
                    "policy" => SharedString::from_shared(policy.policy().name_arc().clone()),
                )
                .increment(1);
            }
        }
    }

    pub(crate) fn store_latency(&self, latency: Duration) {
        self.store_latency.record(latency.as_secs_f64());
    }

    pub(crate) fn denial_cache_hit(&self) {
        self.denial_cache_hits.increment(1);
    }

    /// One refund, given back or failed.
    pub(crate) fn refund(&self, given_back: bool) {
        self.refunds[usize::from(!given_back)].increment(1);
    }

    /// One settlement.
    pub(crate) fn settle(&self, result: SettleResult) {
        self.settlements[result as usize].increment(1);
    }
}

/// How a settlement ended, as `tollgate_settlements_total` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettleResult {
    Exact,
    Refunded,
    Charged,
    Failed,
    NotCounted,
}

impl SettleResult {
    const ALL: [SettleResult; 5] = [
        SettleResult::Exact,
        SettleResult::Refunded,
        SettleResult::Charged,
        SettleResult::Failed,
        SettleResult::NotCounted,
    ];

    fn as_str(self) -> &'static str {
        match self {
            SettleResult::Exact => "exact",
            SettleResult::Refunded => "refunded",
            SettleResult::Charged => "charged",
            SettleResult::Failed => "failed",
            SettleResult::NotCounted => "not_counted",
        }
    }
}

impl fmt::Debug for LimiterMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterMetrics").finish_non_exhaustive()
    }
}

/// The decisions counter of requests that a layer's skip predicate let through, for
/// limiter `layer`: outcome `skipped`, no policy. The limiter is never asked about those
/// requests, so the layer holds this handle and counts them itself.
pub(crate) fn skipped_counter(layer: &str) -> Counter {
    metrics::counter!(
        DECISIONS,
        "layer" => layer.to_owned(),
        "outcome" => outcome(&Decision::Unlimited(UnlimitedReason::Skipped)),
        "policy" => "",
    )
}

/// The breaker state gauge of limiter `name` for the failure domain labelled `node`.
pub(crate) fn breaker_state(name: &Arc<str>, node: &Arc<str>) -> Gauge {
    metrics::gauge!(
        BREAKER_STATE,
        "layer" => SharedString::from_shared(name.clone()),
        "node" => SharedString::from_shared(node.clone()),
    )
}
