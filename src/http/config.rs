//! What a layer is configured with, shared by its services and their futures.

use http::StatusCode;

use crate::http::headers::{HeaderMode, PartitionKey, PolicyFieldCache, RemainingCap};
use crate::http::key::MissingKey;
use crate::limiter::check::Limiter;

#[derive(Debug)]
pub(crate) struct Config<K> {
    pub(crate) limiter: Limiter,
    pub(crate) key: K,
    pub(crate) missing_key: MissingKey,
    pub(crate) header_mode: HeaderMode,
    /// The status of a fail-closed refusal: a 4xx or 5xx other than 500.
    pub(crate) unavailable_status: StatusCode,
    pub(crate) policy_fields: PolicyFieldCache,
    /// How `r` is capped against `t`.
    pub(crate) remaining_cap: RemainingCap,
    /// The secret of the `pk` parameter, when the layer sends one.
    pub(crate) partition_key: Option<PartitionKey>,
}
