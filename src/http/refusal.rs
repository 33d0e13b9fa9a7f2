//! A request the layer answers itself, as one value that either protocol renders.
//!
//! What a refusal says (which fields it carries, when to retry) does not depend on the
//! protocol; only its envelope does. [`Refusal::render`] adds the parts both protocols
//! share (the RateLimit fields, Retry-After) to the envelope that
//! [`response`](super::response) (a problem+json body) or [`grpc`](super::grpc) (a status
//! in a Trailers-Only response) makes of it.

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::http::grpc;
use crate::http::headers::{policy_field_of, state_field, state_field_of};
use crate::http::key::KeyRejection;
use crate::http::response::{self, Fields, RATELIMIT, RATELIMIT_POLICY};
use crate::limiter::decision::{Decision, PolicyReport, RateLimitInfo, whole_seconds};
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

/// The protocol a refusal is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http,
    Grpc,
}

impl<'a> Refusal<'a> {
    /// The refusal `decision` stands for, `None` for a decision that lets the request in.
    /// `unavailable_status` is the layer's status for fail-closed refusals.
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
            Decision::Allowed(_) | Decision::Unlimited(_) | Decision::Shadowed(_) => None,
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

    /// The refusal as a response in `protocol`, with the RateLimit fields as `fields` say.
    pub(crate) fn render(&self, protocol: Protocol, fields: Fields<'_>) -> Response<Bytes> {
        let mut response = match protocol {
            Protocol::Http => response::problem_of(self),
            Protocol::Grpc => grpc::status_of(self),
        };
        let headers = response.headers_mut();
        if fields.mode.on_refused() {
            self.insert_fields(headers, fields);
        }
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// The RateLimit fields of the refusal: every policy's quota and the refusing ones'
    /// state; for a cost no quota admits, the quotas alone (the store was not asked, so
    /// what remains is not known); for a fail-closed refusal the reduced capacity, nothing
    /// (`q=0`) in each window and `r=0` until the retry time.
    fn insert_fields(&self, headers: &mut HeaderMap, fields: Fields<'_>) {
        // Appended, not inserted: Structured Field lists may span several field lines, so
        // a response that already lists an inner layer's policies lists both layers'.
        match self {
            Refusal::Limited(info) => {
                if let Some(policy) = fields.cache.get(info, fields.pk) {
                    headers.append(RATELIMIT_POLICY, policy);
                }
                if let Some(state) = state_field(info.violated(), fields.cap, fields.pk) {
                    headers.append(RATELIMIT, state);
                }
            }
            Refusal::CostExceedsQuota { info, .. } => {
                if let Some(policy) = fields.cache.get(info, fields.pk) {
                    headers.append(RATELIMIT_POLICY, policy);
                }
            }
            Refusal::Unavailable { policies, .. } => {
                let retry_after = self.retry_after_secs().unwrap_or(1);
                let reduced = policies
                    .iter()
                    .map(|p| (p.name(), 0, whole_seconds(p.window_ms())));
                if let Some(value) = policy_field_of(reduced, fields.pk) {
                    headers.append(RATELIMIT_POLICY, value);
                }
                let states = policies.iter().map(|p| (p.name(), 0, retry_after));
                if let Some(value) = state_field_of(states, fields.pk) {
                    headers.append(RATELIMIT, value);
                }
            }
            Refusal::Rejected(_) => {}
        }
    }
}
