//! What a layer is configured with, shared by its services and their futures.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode, response};
use metrics::Counter;

use crate::http::field_forms::FieldForms;
use crate::http::headers::{HeaderMode, PartitionKey, PolicyFieldCache, RemainingCap};
use crate::http::key::MissingKey;
use crate::limiter::decision::Decision;
use crate::limiter::{Limiter, Refusals};

#[derive(Debug)]
pub(crate) struct Config<K> {
    pub(crate) limiter: Limiter,
    pub(crate) key: K,
    pub(crate) missing_key: MissingKey,
    pub(crate) header_mode: HeaderMode,
    /// The forms of the fields written.
    pub(crate) field_forms: FieldForms,
    /// Whether admitted responses carry the decision too (refusals always do).
    pub(crate) decision_on_every_response: bool,
    /// The status of a fail-closed refusal: a 4xx or 5xx other than 500.
    pub(crate) unavailable_status: StatusCode,
    pub(crate) policy_fields: PolicyFieldCache,
    /// How `r` is capped against `t`.
    pub(crate) remaining_cap: RemainingCap,
    /// The secret of the `pk` parameter, when the layer sends one.
    pub(crate) partition_key: Option<PartitionKey>,
    /// Requests that pass uncounted, when the layer skips some.
    pub(crate) skip: Option<Skip>,
    /// What builds refusals, when not the layer's problem+json.
    pub(crate) refusal: Option<RefusalHook>,
    /// What a request costs, when not one unit.
    pub(crate) cost: Option<CostFn>,
    /// What the response changes in what the request counts, when anything.
    pub(crate) after_response: Option<AfterResponse>,
    /// Whether a refusal by the policies refuses, or lets the request through (a soft
    /// limit).
    pub(crate) refusals: Refusals,
}

impl<K> Config<K> {
    /// Whether anything is done to an admitted response after the inner service answered:
    /// fields, the decision in its extensions, a refund or a settlement.
    pub(crate) fn reads_responses(&self) -> bool {
        self.header_mode.on_allowed(http::StatusCode::OK)
            || self.decision_on_every_response
            || self.after_response.is_some()
    }

    /// Whether all an admitted response gets is the draft-11 fields: written within `call`
    /// then, the request's future holds them and neither the decision nor this
    /// configuration.
    pub(crate) fn only_draft11_fields(&self) -> bool {
        self.header_mode.on_allowed(http::StatusCode::OK)
            && !self.field_forms.others()
            && !self.decision_on_every_response
            && self.after_response.is_none()
    }
}

/// The layer's cost function: the units a request consumes.
#[derive(Clone)]
pub(crate) struct CostFn(pub(crate) Arc<dyn Fn(&Parts) -> u64 + Send + Sync>);

impl fmt::Debug for CostFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostFn").finish_non_exhaustive()
    }
}

/// The user's function that says from a response what its request cost.
pub(crate) type SettleFn = dyn Fn(&response::Parts) -> Option<u64> + Send + Sync;

/// What a response changes in what its request counted: one of the two, the later set.
#[derive(Clone)]
pub(crate) enum AfterResponse {
    /// Which responses count: the units of the others are given back.
    CountOnly(Arc<dyn Fn(&response::Parts) -> bool + Send + Sync>),
    /// What the request turned out to cost (`None`: what it reserved): the difference is
    /// settled with the store.
    Settle(Arc<SettleFn>),
    /// The bytes of the response body, charged as they are sent once the body ends or is
    /// dropped.
    CountBytes,
}

impl fmt::Debug for AfterResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AfterResponse::CountOnly(_) => "CountOnly",
            AfterResponse::Settle(_) => "Settle",
            AfterResponse::CountBytes => "CountBytes",
        })
    }
}

/// The predicate of requests that pass uncounted, and the counter that counts them.
#[derive(Clone)]
pub(crate) struct Skip {
    pub(crate) predicate: Arc<dyn Fn(&Parts) -> bool + Send + Sync>,
    pub(crate) counter: Counter,
}

impl fmt::Debug for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Skip").finish_non_exhaustive()
    }
}

/// The user's hook that turns the default refusal into the one sent.
pub(crate) type RefusalFn = dyn Fn(&Decision, Response<Bytes>) -> Response<Bytes> + Send + Sync;

/// [`RefusalFn`] behind an `Arc`, with a `Debug` that names it without calling it.
#[derive(Clone)]
pub(crate) struct RefusalHook(pub(crate) Arc<RefusalFn>);

impl fmt::Debug for RefusalHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefusalHook").finish_non_exhaustive()
    }
}
