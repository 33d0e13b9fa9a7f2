//! The RateLimit-Policy and RateLimit fields of the IETF httpapi draft, as Structured Fields.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use bytes::BufMut;
use http::{HeaderValue, StatusCode};

use crate::http::typed_headers::format::{self, with_field_buffer};
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
/// use tollgate::response::HeaderMode;
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
    #[inline]
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
    pub(crate) fn remaining(self, policy: &PolicyReport<'_>) -> u64 {
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

/// `RateLimit-Policy: "per-second";q=50;w=1, "per-day";q=1000000;w=86400`: every policy,
/// with `pk` when given.
pub(crate) fn policy_field(info: &RateLimitInfo, pk: Option<&[u8]>) -> Option<HeaderValue> {
    let units = info.policies().map(|p| {
        (
            (p.name(), p.quota(), p.window_secs()),
            p.policy().counts_content_bytes().then_some(CONTENT_BYTES),
        )
    });
    list_field_with_units(units, (format::QUOTA, format::WINDOW), pk)
}

/// The quota unit of a policy that counts bytes of content.
const CONTENT_BYTES: &str = "content-bytes";

/// `RateLimit-Policy` from `(name, q, w)` triples.
pub(crate) fn policy_field_of<'a>(
    policies: impl IntoIterator<Item = (&'a str, u64, u64)>,
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    list_field(policies, (format::QUOTA, format::WINDOW), pk)
}

/// `RateLimit: "per-second";r=0;t=1`: the given policies' current state, `r` capped, with
/// `pk` when given.
pub(crate) fn state_field<'a>(
    policies: impl IntoIterator<Item = PolicyReport<'a>>,
    cap: RemainingCap,
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    state_field_of(
        policies
            .into_iter()
            .map(|p| (p.name(), cap.remaining(&p), p.reset_secs())),
        pk,
    )
}

/// `RateLimit` from `(name, r, t)` triples.
pub(crate) fn state_field_of<'a>(
    policies: impl IntoIterator<Item = (&'a str, u64, u64)>,
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    list_field(policies, (format::REMAINING, format::RESET), pk)
}

/// A Structured Field list of `"name";a=1;b=2` items, one per `(name, a, b)` triple, with
/// `;pk=:...:` on each when given; `None` when no item could be written.
///
/// Written by hand rather than with a general serializer: every item has this one shape,
/// and this runs on every response. Policy names are checked when a policy is built
/// (printable ASCII), so each is a valid Structured Field string once `"` and `\` are
/// escaped; a name that is not is left out, as a serializer would refuse it.
fn list_field<'a>(
    items: impl IntoIterator<Item = (&'a str, u64, u64)>,
    params: (&str, &str),
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    list_field_with_units(items.into_iter().map(|item| (item, None)), params, pk)
}

/// [`list_field`], each item with its quota unit (`qu`) when it is not requests.
fn list_field_with_units<'a>(
    items: impl IntoIterator<Item = ((&'a str, u64, u64), Option<&'static str>)>,
    (first, second): (&str, &str),
    pk: Option<&[u8]>,
) -> Option<HeaderValue> {
    with_field_buffer(|buffer| {
        for ((name, a, b), unit) in items {
            if !format::is_sf_string(name) {
                continue;
            }
            format::push_separator(buffer);
            format::push_string(buffer, name);
            format::push_integer(buffer, first, a);
            format::push_integer(buffer, second, b);
            if let Some(unit) = unit {
                format::push_string_param(buffer, format::QUOTA_UNIT, unit);
            }
            if let Some(pk) = pk {
                format::push_bytes(buffer, format::PARTITION_KEY, pk);
            }
        }
        if buffer.is_empty() {
            return None;
        }
        HeaderValue::from_maybe_shared(buffer.split().freeze()).ok()
    })
}

/// RateLimit-Policy values by policy set: the field depends on the set alone (names,
/// quotas, windows), so it is serialized once per set, not per response. A set is known by
/// its allocation, which the cache holds: limits swapped in are new sets, so a response
/// never advertises the policies of limits swapped out.
///
/// Read from an atomic snapshot. A value is kept for the process (distinct values are few:
/// a handful per limiter and swap), so that each response's copy is a static reference;
/// past [`MAX_STATIC_FIELDS`] values each response's value is copied into this thread's
/// field buffer. A lock, or one shared `HeaderValue` cloned by every response, would be
/// counters written by every request on every core.
#[derive(Debug, Default)]
pub(crate) struct PolicyFieldCache {
    fields: ArcSwap<Vec<(Arc<[Policy]>, CachedField)>>,
}

/// How many distinct RateLimit-Policy values the process keeps for good.
const MAX_STATIC_FIELDS: usize = 4_096;

/// `value` as a value of static bytes, which a copy does not count, if there is room.
fn kept_for_the_process(value: &HeaderValue) -> Option<HeaderValue> {
    static KEPT: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    // Visible ASCII, as `from_static` requires.
    let text = value.to_str().ok()?;
    // A panic while the set was locked left it whole (one insert): still usable.
    let mut kept = KEPT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(found) = kept.get(text) {
        return Some(HeaderValue::from_static(found));
    }
    if kept.len() >= MAX_STATIC_FIELDS {
        return None;
    }
    let leaked: &'static str = Box::leak(text.into());
    kept.insert(leaked);
    Some(HeaderValue::from_static(leaked))
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
        // Made once for a set stored for the process (the limits' own, and local shares').
        let kept = || kept_for_the_process(&policy_field(info, None)?);
        if let Some(value) = info.reported_set().policy_field(kept) {
            return Some(value);
        }
        let set = info.policy_set();
        let find = |fields: &[(Arc<[Policy]>, CachedField)]| {
            fields
                .iter()
                .find(|(cached, _)| Arc::ptr_eq(cached, set))
                .map(|(_, value)| value.copy())
        };
        if let Some(value) = find(&self.fields.load()) {
            return value;
        }
        let value = policy_field(info, None)?;
        let cached = match kept_for_the_process(&value) {
            Some(kept) => CachedField::Static(kept),
            None => CachedField::Shared(value.clone()),
        };
        self.fields.rcu(|fields| {
            let mut fields = Vec::clone(fields);
            if find(&fields).is_none() {
                // Sets swapped out of a limiter are never asked for again: the oldest goes.
                if fields.len() >= MAX_CACHED_SETS {
                    fields.remove(0);
                }
                fields.push((set.clone(), cached.clone()));
            }
            fields
        });
        Some(value)
    }
}

/// A cached RateLimit-Policy value, and how a response gets its copy.
#[derive(Clone, Debug)]
enum CachedField {
    /// Of static bytes: the copy is the reference.
    Static(HeaderValue),
    /// Shared bytes: copied into this thread's field buffer.
    Shared(HeaderValue),
}

impl CachedField {
    fn copy(&self) -> Option<HeaderValue> {
        match self {
            CachedField::Static(value) => Some(value.clone()),
            CachedField::Shared(value) => with_field_buffer(|buffer| {
                buffer.put_slice(value.as_bytes());
                HeaderValue::from_maybe_shared(buffer.split().freeze()).ok()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every item of `field` as (name, parameters), parsed by a general Structured Field
    /// parser.
    fn parse(field: &HeaderValue) -> Vec<(String, Vec<(String, sfv::BareItem)>)> {
        let list = sfv::Parser::new(field.as_bytes())
            .parse::<sfv::List>()
            .unwrap_or_else(|e| panic!("{field:?} does not parse: {e}"));
        list.into_iter()
            .map(|entry| {
                let sfv::ListEntry::Item(item) = entry else {
                    panic!("an inner list in {field:?}");
                };
                let sfv::BareItem::String(name) = item.bare_item else {
                    panic!("a name that is not a string in {field:?}");
                };
                let params = item
                    .params
                    .into_iter()
                    .map(|(key, value)| (key.as_str().to_owned(), value))
                    .collect();
                (name.as_str().to_owned(), params)
            })
            .collect()
    }

    fn integer(value: i64) -> sfv::BareItem {
        sfv::BareItem::Integer(sfv::Integer::constant(value))
    }

    #[test]
    fn state_fields_parse_back_with_escaped_names_and_capped_integers() {
        let field = state_field_of(
            [("per-second", 0, 1), ("a \"q\" \\ b", u64::MAX, 86_400)],
            None,
        )
        .expect("two items");
        assert_eq!(
            parse(&field),
            [
                (
                    "per-second".to_owned(),
                    vec![("r".to_owned(), integer(0)), ("t".to_owned(), integer(1))]
                ),
                (
                    "a \"q\" \\ b".to_owned(),
                    vec![
                        ("r".to_owned(), integer(999_999_999_999_999)),
                        ("t".to_owned(), integer(86_400))
                    ]
                ),
            ]
        );
    }

    #[test]
    fn partition_keys_are_byte_sequences_of_every_length() {
        for len in 0..=PARTITION_KEY_LEN {
            let pk: Vec<u8> = (0..len).map(|i| (i * 37 + 5) as u8).collect();
            let field = policy_field_of([("per-day", 1_000_000, 86_400)], Some(&pk)).unwrap();
            let items = parse(&field);
            assert_eq!(
                items[0].1,
                vec![
                    ("q".to_owned(), integer(1_000_000)),
                    ("w".to_owned(), integer(86_400)),
                    ("pk".to_owned(), sfv::BareItem::ByteSequence(pk.clone())),
                ],
                "{field:?}"
            );
        }
    }

    #[test]
    fn names_that_are_not_strings_are_left_out() {
        assert_eq!(state_field_of([("caf\u{e9}", 1, 1)], None), None);
        let field = state_field_of([("caf\u{e9}", 1, 1), ("ok", 2, 3)], None).unwrap();
        assert_eq!(field, "\"ok\";r=2;t=3");
    }

    #[test]
    fn fields_written_one_after_another_stay_apart() {
        let fields: Vec<HeaderValue> = (0..1_000u64)
            .map(|i| state_field_of([("per-minute", i, 60)], None).unwrap())
            .collect();
        for (i, field) in fields.iter().enumerate() {
            assert_eq!(*field, format!("\"per-minute\";r={i};t=60").as_str());
        }
    }
}
