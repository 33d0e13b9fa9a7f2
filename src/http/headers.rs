//! The RateLimit-Policy and RateLimit fields of the IETF httpapi draft, as Structured Fields.

use std::sync::{Arc, RwLock};

use http::HeaderValue;
use sfv::{Integer, KeyRef, ListSerializer, StringRef};

use crate::limiter::decision::{PolicyReport, RateLimitInfo};
use crate::store::policy::Policy;

/// Which responses carry `RateLimit-Policy` and `RateLimit`.
///
/// Refusals always carry `Retry-After`.
///
/// ```
/// use tollgate::HeaderMode;
/// assert_eq!(HeaderMode::default(), HeaderMode::Always);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderMode {
    /// On every response the limiter decided (allowed and refused).
    #[default]
    Always,
    /// Only on refusals.
    OnRefusal,
    /// Never.
    Never,
}

impl HeaderMode {
    pub(crate) fn on_allowed(self) -> bool {
        self == HeaderMode::Always
    }

    pub(crate) fn on_refused(self) -> bool {
        self != HeaderMode::Never
    }
}

const Q: &KeyRef = KeyRef::constant("q");
const W: &KeyRef = KeyRef::constant("w");
const R: &KeyRef = KeyRef::constant("r");
const T: &KeyRef = KeyRef::constant("t");

/// `RateLimit-Policy: "per-second";q=50;w=1, "per-day";q=1000000;w=86400`: every policy.
pub(crate) fn policy_field(info: &RateLimitInfo) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for policy in info.policies() {
        let Ok(name) = StringRef::from_str(policy.name()) else {
            continue;
        };
        list.bare_item(name)
            .parameter(Q, integer(policy.quota()))
            .parameter(W, integer(policy.window_secs()));
    }
    list.finish().and_then(|s| HeaderValue::try_from(s).ok())
}

/// `RateLimit: "per-second";r=0;t=1`: the given policies' current state.
pub(crate) fn state_field<'a>(
    policies: impl IntoIterator<Item = &'a PolicyReport>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for policy in policies {
        let Ok(name) = StringRef::from_str(policy.name()) else {
            continue;
        };
        list.bare_item(name)
            .parameter(R, integer(policy.remaining()))
            .parameter(T, integer(policy.reset_secs()));
    }
    list.finish().and_then(|s| HeaderValue::try_from(s).ok())
}

// Structured Field integers have at most 15 digits.
fn integer(value: u64) -> Integer {
    Integer::try_from(value).unwrap_or(Integer::MAX)
}

/// RateLimit-Policy values by policy set: the field depends on the set alone (names,
/// quotas, windows), so it is serialized once per set, not per response.
#[derive(Debug, Default)]
pub(crate) struct PolicyFieldCache {
    fields: RwLock<Vec<(Arc<[Policy]>, HeaderValue)>>,
}

// Default and tier sets, and the local shares of each for the instance counts seen.
const MAX_CACHED_SETS: usize = 64;

impl PolicyFieldCache {
    pub(crate) fn get(&self, info: &RateLimitInfo) -> Option<HeaderValue> {
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
        let value = policy_field(info)?;
        let mut fields = self.fields.write().unwrap_or_else(|e| e.into_inner());
        if fields.len() < MAX_CACHED_SETS && cached(&fields).is_none() {
            fields.push((set.clone(), value.clone()));
        }
        Some(value)
    }
}
