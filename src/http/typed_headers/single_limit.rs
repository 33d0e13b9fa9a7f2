//! The single-limit forms of the rate-limit fields, read: draft 7's combined `RateLimit`,
//! draft 6's `RateLimit-Limit`/`-Remaining`/`-Reset`, and `X-RateLimit-*` (reset as a Unix
//! time), as servers other than tollgate's default write them.

use std::time::Duration;

use crate::http::response::{
    RATELIMIT, RATELIMIT_LIMIT, RATELIMIT_REMAINING, RATELIMIT_RESET, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use http::{HeaderMap, HeaderName};

/// One limit as the single-limit forms of the fields carry it, read from a response's
/// headers: draft 7's combined `RateLimit: limit=50, remaining=0, reset=3`, draft 6's
/// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`, or GitHub's
/// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (a Unix time in
/// seconds). Draft 11's fields are read by [`RateLimitHeader`](crate::headers::RateLimitHeader).
///
/// ```
/// use std::time::Duration;
/// use tollgate::headers::SingleLimit;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("ratelimit", "limit=50, remaining=0, reset=3".parse().unwrap());
/// let read = SingleLimit::read(&headers, 0).unwrap();
/// assert_eq!((read.limit(), read.remaining()), (Some(50), 0));
/// assert_eq!(read.exhausted_for(), Some(Duration::from_secs(3)));
///
/// // GitHub's form: the reset is a Unix time.
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-ratelimit-remaining", "0".parse().unwrap());
/// headers.insert("x-ratelimit-reset", "1700000060".parse().unwrap());
/// let read = SingleLimit::read(&headers, 1_700_000_000_000).unwrap();
/// assert_eq!(read.exhausted_for(), Some(Duration::from_secs(60)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SingleLimit {
    limit: Option<u64>,
    remaining: u64,
    reset: Option<Duration>,
}

impl SingleLimit {
    /// The limit read from `headers` of a response that arrived at `now_ms` (Unix
    /// milliseconds, which an `X-RateLimit-Reset` time is measured from): draft 7's form
    /// first, then draft 6's, then `X-RateLimit-*`. `None` when none of them is there, or
    /// what is there does not read as whole numbers.
    pub fn read(headers: &HeaderMap, now_ms: u64) -> Option<Self> {
        draft_7(headers)
            .or_else(|| draft_6(headers))
            .or_else(|| x_ratelimit(headers, now_ms))
    }

    /// The quota, when the fields give it.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// What remains.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// How long until the limit resets, when the fields say.
    pub fn reset(&self) -> Option<Duration> {
        self.reset
    }

    /// How long to wait before calling again: the reset, when nothing remains.
    pub fn exhausted_for(&self) -> Option<Duration> {
        (self.remaining == 0).then_some(self.reset?)
    }
}

/// A field's value as a whole number.
fn number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    std::str::from_utf8(headers.get(name)?.as_bytes())
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `RateLimit: limit=50, remaining=0, reset=3`, a Structured Field dictionary.
fn draft_7(headers: &HeaderMap) -> Option<SingleLimit> {
    let value = headers.get(RATELIMIT)?;
    let dictionary = sfv::Parser::new(value.as_bytes())
        .parse::<sfv::Dictionary>()
        .ok()?;
    let integer = |key: &str| match dictionary.get(key)? {
        sfv::ListEntry::Item(item) => u64::try_from(i64::from(item.bare_item.as_integer()?)).ok(),
        sfv::ListEntry::InnerList(_) => None,
    };
    Some(SingleLimit {
        limit: integer("limit"),
        remaining: integer("remaining")?,
        reset: integer("reset").map(Duration::from_secs),
    })
}

/// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds from now).
fn draft_6(headers: &HeaderMap) -> Option<SingleLimit> {
    Some(SingleLimit {
        limit: number(headers, &RATELIMIT_LIMIT),
        remaining: number(headers, &RATELIMIT_REMAINING)?,
        reset: number(headers, &RATELIMIT_RESET).map(Duration::from_secs),
    })
}

/// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (a Unix time).
fn x_ratelimit(headers: &HeaderMap, now_ms: u64) -> Option<SingleLimit> {
    Some(SingleLimit {
        limit: number(headers, &X_RATELIMIT_LIMIT),
        remaining: number(headers, &X_RATELIMIT_REMAINING)?,
        reset: number(headers, &X_RATELIMIT_RESET).map(|at_secs| {
            Duration::from_millis(at_secs.saturating_mul(1_000).saturating_sub(now_ms))
        }),
    })
}
