//! The RateLimit-Policy and RateLimit fields of the IETF httpapi draft, as Structured Fields.

use std::sync::{Arc, RwLock};

use http::{HeaderValue, StatusCode};
use sfv::{Integer, KeyRef, ListSerializer, StringRef};

use crate::limiter::decision::{PolicyReport, RateLimitInfo};
use crate::store::digest::{DIGEST_LEN, KeyedDigest};
use crate::store::policy::Policy;

/// Which responses carry `RateLimit-Policy` and `RateLimit`.
///
/// Refusals always carry `Retry-After`. The default leaves the fields off redirections:
/// the draft warns that a low `r` on a 3xx may keep a client from following `Location`,
/// although following it costs nothing here (the redirect was already counted).
///
/// ```
/// use tollgate::HeaderMode;
/// assert_eq!(HeaderMode::default(), HeaderMode::ExceptRedirects);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderMode {
    /// On every response the limiter decided (allowed and refused), redirections included.
    Always,
    /// On every response the limiter decided except allowed 3xx responses.
    #[default]
    ExceptRedirects,
    /// Only on refusals.
    OnRefusal,
    /// Never.
    Never,
}

impl HeaderMode {
    pub(crate) fn on_allowed(self, status: StatusCode) -> bool {
        match self {
            HeaderMode::Always => true,
            HeaderMode::ExceptRedirects => !status.is_redirection(),
            HeaderMode::OnRefusal | HeaderMode::Never => false,
        }
    }

    pub(crate) fn on_refused(self) -> bool {
        self != HeaderMode::Never
    }
}

/// How `r` is capped against `t` (the layer's
/// [`remaining_horizon`](crate::RateLimitLayer::remaining_horizon)).
///
/// `r` is advertised as at most `ceil(q * max(t, horizon) / w)`: what the policy's average
/// rate admits over `t`, or over the horizon when `t` is shorter. A client that spends all
/// of `r` at once then takes at most a horizon's worth of the average rate, and a client
/// that paces `r` over `t` never goes faster than the average once `t` reaches the horizon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RemainingCap {
    /// Whole seconds; `None` leaves `r` as the store computed it.
    pub(crate) horizon_secs: Option<u64>,
}

/// The default horizon: a minute. Policies whose window is a minute or shorter are never
/// capped (their whole quota fits), while a per-day policy no longer advertises its whole
/// day's quota as available in the next second.
pub(crate) const DEFAULT_HORIZON_SECS: u64 = 60;

impl Default for RemainingCap {
    fn default() -> Self {
        Self {
            horizon_secs: Some(DEFAULT_HORIZON_SECS),
        }
    }
}

impl RemainingCap {
    /// `r` as advertised for `policy`: never more than the store's value, never below 1
    /// while the policy still admits.
    pub(crate) fn remaining(self, policy: &PolicyReport) -> u64 {
        let r = policy.remaining();
        let Some(horizon) = self.horizon_secs else {
            return r;
        };
        let span = u128::from(policy.reset_secs().max(horizon));
        let window = u128::from(policy.window_secs().max(1));
        let cap = (u128::from(policy.quota()) * span).div_ceil(window).max(1);
        if u128::from(r) > cap {
            // cap < r <= u64::MAX
            cap as u64
        } else {
            r
        }
    }
}

/// The `pk` parameter: a keyed digest of the caller key (HMAC-SHA-256 under the layer's
/// secret, the first 16 bytes), never the key itself.
pub(crate) type PartitionKey = KeyedDigest;

/// The length of `pk`, in bytes.
pub(crate) const PARTITION_KEY_LEN: usize = DIGEST_LEN;

const Q: &KeyRef = KeyRef::constant("q");
const W: &KeyRef = KeyRef::constant("w");
const R: &KeyRef = KeyRef::constant("r");
const T: &KeyRef = KeyRef::constant("t");
const PK: &KeyRef = KeyRef::constant("pk");

/// `RateLimit-Policy: "per-second";q=50;w=1, "per-day";q=1000000;w=86400`: every policy,
/// with `pk` when given.
pub(crate) fn policy_field(info: &RateLimitInfo, pk: Option<&[u8]>) -> Option<HeaderValue> {
    policy_field_of(
        info.policies()
            .iter()
            .map(|p| (p.name(), p.quota(), p.window_secs())),
        pk,
    )
}

/// `RateLimit-Policy` from `(name, q, w)` triples.
pub(crate) fn policy_field_of<'a>(
    policies: impl IntoIterator<Item = (&'a str, u64, u64)>,
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (name, quota, window_secs) in policies {
        let Ok(name) = StringRef::from_str(name) else {
            continue;
        };
        let item = list
            .bare_item(name)
            .parameter(Q, integer(quota))
            .parameter(W, integer(window_secs));
        if let Some(pk) = pk {
            item.parameter(PK, pk);
        }
    }
    list.finish().and_then(|s| HeaderValue::try_from(s).ok())
}

/// `RateLimit: "per-second";r=0;t=1`: the given policies' current state, `r` capped, with
/// `pk` when given.
pub(crate) fn state_field<'a>(
    policies: impl IntoIterator<Item = &'a PolicyReport>,
    cap: RemainingCap,
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    state_field_of(
        policies
            .into_iter()
            .map(|p| (p.name(), cap.remaining(p), p.reset_secs())),
        pk,
    )
}

/// `RateLimit` from `(name, r, t)` triples.
pub(crate) fn state_field_of<'a>(
    policies: impl IntoIterator<Item = (&'a str, u64, u64)>,
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (name, remaining, reset_secs) in policies {
        let Ok(name) = StringRef::from_str(name) else {
            continue;
        };
        let item = list
            .bare_item(name)
            .parameter(R, integer(remaining))
            .parameter(T, integer(reset_secs));
        if let Some(pk) = pk {
            item.parameter(PK, pk);
        }
    }
    list.finish().and_then(|s| HeaderValue::try_from(s).ok())
}

// Structured Field integers have at most 15 digits.
fn integer(value: u64) -> Integer {
    Integer::try_from(value).unwrap_or(Integer::MAX)
}

/// RateLimit-Policy values by policy set: the field depends on the set alone (names,
/// quotas, windows), so it is serialized once per set, not per response. A set is known by
/// its allocation, which the cache holds: limits swapped in are new sets, so a response
/// never advertises the policies of limits swapped out.
#[derive(Debug, Default)]
pub(crate) struct PolicyFieldCache {
    fields: RwLock<Vec<(Arc<[Policy]>, HeaderValue)>>,
}

// Default and tier sets, and the local shares of each for the instance counts seen (of
// the limits in force, and of a few swapped out).
const MAX_CACHED_SETS: usize = 64;

impl PolicyFieldCache {
    /// The field for `info`'s set; with a partition key the field is the caller's own,
    /// serialized for this response.
    pub(crate) fn get(&self, info: &RateLimitInfo, pk: Option<&[u8]>) -> Option<HeaderValue> {
        if pk.is_some() {
            return policy_field(info, pk);
        }
        let set = info.policy_set();
        let cached = |fields: &[(Arc<[Policy]>, HeaderValue)]| {
            fields
                .iter()
                .find(|(cached, _)| Arc::ptr_eq(cached, set))
                .map(|(_, value)| value.clone())
        };
        if let Some(value) = cached(&self.fields.read().unwrap_or_else(|e| e.into_inner())) {
            return Some(value);
        }
        let value = policy_field(info, None)?;
        let mut fields = self.fields.write().unwrap_or_else(|e| e.into_inner());
        if cached(&fields).is_none() {
            // Sets swapped out of a limiter are never asked for again: the oldest goes.
            if fields.len() >= MAX_CACHED_SETS {
                fields.remove(0);
            }
            fields.push((set.clone(), value.clone()));
        }
        Some(value)
    }
}
