//! Every metric tollgate records, in one place (the table is in the crate docs).
//!
//! Label values are the layer's name, policy names, outcomes and reasons: never a caller
//! key, which is untrusted input of unbounded cardinality.

use std::sync::Arc;
use std::time::Duration;

use metrics::SharedString;

use crate::decision::Decision;

pub(crate) const DECISIONS: &str = "tollgate_decisions_total";
pub(crate) const FALLBACKS: &str = "tollgate_fallbacks_total";
pub(crate) const BREAKER_STATE: &str = "tollgate_breaker_state";
pub(crate) const STORE_LATENCY: &str = "tollgate_store_latency_seconds";
pub(crate) const DENIAL_CACHE_HITS: &str = "tollgate_denial_cache_hits_total";

fn layer(name: &Arc<str>) -> SharedString {
    SharedString::from_shared(name.clone())
}

/// One decision, by outcome and (for refusals) the first refusing policy.
pub(crate) fn decision(name: &Arc<str>, decision: &Decision) {
    let (outcome, policy) = outcome(decision);
    metrics::counter!(DECISIONS, "layer" => layer(name), "outcome" => outcome, "policy" => policy)
        .increment(1);
}

fn outcome(decision: &Decision) -> (&'static str, SharedString) {
    let violated = |d: &Decision| {
        d.info()
            .and_then(|info| info.violated().next())
            .map(|p| SharedString::from_shared(p.name_arc().clone()))
            .unwrap_or_default()
    };
    match decision {
        Decision::Allowed(_) => ("allowed", SharedString::const_str("")),
        Decision::Limited(_) => ("limited", violated(decision)),
        Decision::Unavailable { .. } => ("unavailable", SharedString::const_str("")),
        Decision::Unlimited(_) => ("unlimited", SharedString::const_str("")),
        Decision::Shadowed(inner) => match **inner {
            Decision::Limited(_) => ("shadow_limited", violated(inner)),
            Decision::Unavailable { .. } => ("shadow_unavailable", SharedString::const_str("")),
            Decision::Unlimited(_) => ("shadow_unlimited", SharedString::const_str("")),
            _ => ("shadow_allowed", SharedString::const_str("")),
        },
    }
}

pub(crate) fn fallback(name: &Arc<str>, reason: &'static str, policy: &'static str) {
    metrics::counter!(FALLBACKS, "layer" => layer(name), "reason" => reason, "policy" => policy)
        .increment(1);
}

pub(crate) fn breaker_state(name: &Arc<str>, state: u8) {
    metrics::gauge!(BREAKER_STATE, "layer" => layer(name)).set(f64::from(state));
}

pub(crate) fn store_latency(name: &Arc<str>, latency: Duration) {
    metrics::histogram!(STORE_LATENCY, "layer" => layer(name)).record(latency.as_secs_f64());
}

pub(crate) fn denial_cache_hit(name: &Arc<str>) {
    metrics::counter!(DENIAL_CACHE_HITS, "layer" => layer(name)).increment(1);
}
