//! A request the layer answers itself, as one value that either protocol renders.
//!
//! What a refusal says (which fields it carries, when to retry) does not depend on the
//! protocol; only its envelope does, which [`render`](super::render) makes.

use http::StatusCode;

use crate::http::key::KeyRejection;
use crate::limiter::decision::{Decision, PolicyReport, RateLimitInfo};
use crate::store::policy::Policy;

/// Why the layer answers a request without calling the inner service.
pub(crate) enum Refusal<'a> {
    /// A policy refused the request (429, RESOURCE_EXHAUSTED).
    Limited(&'a RateLimitInfo),
    /// The request costs more than `policy`'s quota: no wait would admit it.
    CostExceedsQuota {
        info: &'a RateLimitInfo,
        policy: PolicyReport<'a>,
    },
    /// The store cannot decide and the limiter fails closed (503 or the layer's status,
    /// UNAVAILABLE).
    Unavailable {
        status: StatusCode,
        retry_after_secs: u64,
        policies: &'a [Policy],
    },
    /// The key extractor refused the request, or it has no key and the layer rejects such.
    Rejected(&'a KeyRejection),
}

impl<'a> Refusal<'a> {
    /// The refusal `decision` stands for, `None` for a decision that lets the request in.
    /// `unavailable_status` is the layer's status for fail-closed refusals.
    #[inline]
    pub(crate) fn of(decision: &'a Decision, unavailable_status: StatusCode) -> Option<Self> {
        match decision {
            Decision::Limited(info) => Some(match info.unaffordable() {
                Some(policy) => Refusal::CostExceedsQuota { info, policy },
                None => Refusal::Limited(info),
            }),
            Decision::Unavailable {
                retry_after_secs,
                policies,
                ..
            } => Some(Refusal::Unavailable {
                status: unavailable_status,
                retry_after_secs: *retry_after_secs,
                policies,
            }),
            Decision::Allowed(_)
            | Decision::Unlimited(_)
            | Decision::Shadowed(_)
            | Decision::SoftLimited(_) => None,
        }
    }

    /// Whole seconds until a retry can succeed (at least 1), when waiting helps at all.
    pub(crate) fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Refusal::Limited(info) => Some(info.retry_after_secs().max(1)),
            Refusal::Unavailable {
                retry_after_secs, ..
            } => Some((*retry_after_secs).max(1)),
            Refusal::CostExceedsQuota { .. } | Refusal::Rejected(_) => None,
        }
    }

    /// Milliseconds until a retry can succeed (at least 1), when waiting helps: the
    /// store's own figure for a refusal by a policy, the whole seconds of Retry-After for
    /// a fail-closed one.
    pub(crate) fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Refusal::Limited(info) => Some(info.retry_after_ms().max(1)),
            _ => self
                .retry_after_secs()
                .map(|secs| secs.saturating_mul(1000)),
        }
    }
}
