//! A refusal rendered in the request's protocol: the envelope [`response`](super::response)
//! (a problem+json body) or [`grpc`](super::grpc) (a status in a Trailers-Only response)
//! makes of it, with the parts both share (the RateLimit fields, Retry-After).

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Response};

use crate::http::field_forms::{self, OneLimit};
use crate::http::grpc;
use crate::http::headers::{policy_field_of, state_field, state_field_of};
use crate::http::refusal::Refusal;
use crate::http::response::{self, Fields, RATELIMIT, RATELIMIT_POLICY};
use crate::limiter::decision::whole_seconds;

/// The protocol a refusal is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http,
    Grpc,
}

impl Refusal<'_> {
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
        if fields.forms.others() {
            let limit = match self {
                Refusal::Limited(info) => OneLimit::of(info, fields.cap),
                // Nothing is admitted until the store is back: no quota, none left.
                Refusal::Unavailable { policies, .. } => Some(OneLimit {
                    limit: 0,
                    window_secs: policies.first().map_or(1, |p| whole_seconds(p.window_ms())),
                    remaining: 0,
                    reset_secs: self.retry_after_secs().unwrap_or(1),
                }),
                // What remains is not known (the store was not asked), or no decision.
                Refusal::CostExceedsQuota { .. } | Refusal::Rejected(_) => None,
            };
            if let Some(limit) = limit {
                field_forms::append(headers, fields.forms, limit);
            }
        }
        if !fields.forms.draft11() {
            return;
        }
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
