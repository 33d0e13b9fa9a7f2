//! What a response says about when to call again: `Retry-After` on a 429 or 503, a
//! `RateLimit` policy with no units left, gRPC's `grpc-retry-pushback-ms` (a wait, or "do
//! not retry").

use std::time::{Duration, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, StatusCode};

use crate::client::error::HoldReason;
use crate::http::response::RATELIMIT;
use crate::http::typed_headers::retry_after::RetryAfter;
use crate::http::typed_headers::single_limit::SingleLimit;
use crate::http::typed_headers::state::RateLimitHeader;

const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// The wait gRPC's "do not retry" asks for: one with no end, which the layer caps at its
/// longest hold as it caps any other.
pub(super) const NO_END: Duration = Duration::MAX;

/// The longest wait `headers` ask for, and why, for a response that arrived at `now_ms`
/// (Unix milliseconds, which a `Retry-After` date is measured from). A field that does not
/// decode says nothing.
pub(super) fn advertised_wait(
    status: StatusCode,
    headers: &HeaderMap,
    now_ms: u64,
) -> Option<(Duration, HoldReason)> {
    let mut longest: Option<(Duration, HoldReason)> = None;
    let mut consider = |wait: Duration, reason| {
        if !wait.is_zero() && longest.is_none_or(|(w, _)| wait > w) {
            longest = Some((wait, reason));
        }
    };
    if (status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE)
        && let Some(value) = headers.get(RETRY_AFTER)
        && let Ok(after) = RetryAfter::parse(value.as_bytes())
    {
        let now = UNIX_EPOCH + Duration::from_millis(now_ms);
        consider(after.wait_from(now), HoldReason::RetryAfter);
    }
    let mut lines = headers.get_all(RATELIMIT).iter();
    if let Ok(state) = <RateLimitHeader as headers::Header>::decode(&mut lines)
        && let Some(wait) = state.exhausted_for()
    {
        consider(wait, HoldReason::RateLimitHeader);
    }
    // The forms of the fields that carry one limit: draft 7's, draft 6's, X-RateLimit-*.
    if let Some(wait) = SingleLimit::read(headers, now_ms).and_then(|l| l.exhausted_for()) {
        consider(wait, HoldReason::RateLimitHeader);
    }
    if let Some((wait, reason)) = grpc_pushback(headers) {
        consider(wait, reason);
    }
    longest
}

/// What `grpc-retry-pushback-ms` asks for in `fields`: the headers of a Trailers-Only
/// answer, or the trailers of any other gRPC answer, where the gRPC status sits beside it.
///
/// - Milliseconds above zero: a wait that long.
/// - A negative or non-integer value, beside RESOURCE_EXHAUSTED or UNAVAILABLE: gRPC's
///   "do not retry", a wait with no end ([`NO_END`]).
/// - Anything else: nothing. Zero asks for no wait; "do not retry" beside another status
///   is about that call (a bad argument, a missing entity), not about the server's
///   capacity, and beside OK, or with no gRPC status, there is no failed call to retry.
pub(super) fn grpc_pushback(fields: &HeaderMap) -> Option<(Duration, HoldReason)> {
    let value = fields.get(GRPC_RETRY_PUSHBACK_MS)?;
    let ms = std::str::from_utf8(value.as_bytes())
        .ok()
        .and_then(|text| text.trim().parse::<i64>().ok());
    match ms {
        Some(ms) if ms > 0 => Some((
            Duration::from_millis(ms.unsigned_abs()),
            HoldReason::GrpcPushback,
        )),
        Some(0) => None,
        _ if refused_for_capacity(fields) => Some((NO_END, HoldReason::GrpcNoRetry)),
        _ => None,
    }
}

/// Whether the gRPC status in `fields` is RESOURCE_EXHAUSTED (8) or UNAVAILABLE (14), the
/// statuses of a server short of capacity, as 429 and 503 are in HTTP.
fn refused_for_capacity(fields: &HeaderMap) -> bool {
    fields
        .get(GRPC_STATUS)
        .is_some_and(|status| matches!(status.as_bytes(), b"8" | b"14"))
}

/// `now_ms` as a [`SystemTime`], for tests that compare dates.
#[cfg(test)]
pub(super) fn system_time(now_ms: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_millis(now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse::<HeaderName>().unwrap(), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn the_single_limit_forms_hold_too() {
        let now_ms = 1_700_000_000_000;
        for (pairs, wait) in [
            (vec![("ratelimit", "limit=50, remaining=0, reset=4")], 4),
            (
                vec![("ratelimit-remaining", "0"), ("ratelimit-reset", "5")],
                5,
            ),
            (
                vec![
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1700000006"),
                ],
                6,
            ),
        ] {
            assert_eq!(
                advertised_wait(StatusCode::OK, &headers(&pairs), now_ms),
                Some((Duration::from_secs(wait), HoldReason::RateLimitHeader)),
                "{pairs:?}"
            );
        }
        // Something left: no wait.
        let left = headers(&[("ratelimit", "limit=50, remaining=3, reset=4")]);
        assert_eq!(advertised_wait(StatusCode::OK, &left, now_ms), None);
    }

    #[test]
    fn the_longest_wait_wins() {
        let h = headers(&[
            ("retry-after", "2"),
            ("ratelimit", r#""s";r=0;t=1, "m";r=0;t=30"#),
            ("grpc-retry-pushback-ms", "1500"),
        ]);
        assert_eq!(
            advertised_wait(StatusCode::TOO_MANY_REQUESTS, &h, 0),
            Some((Duration::from_secs(30), HoldReason::RateLimitHeader))
        );
        let h = headers(&[("retry-after", "2"), ("grpc-retry-pushback-ms", "2500")]);
        assert_eq!(
            advertised_wait(StatusCode::SERVICE_UNAVAILABLE, &h, 0),
            Some((Duration::from_millis(2500), HoldReason::GrpcPushback))
        );
    }

    #[test]
    fn retry_after_counts_only_on_429_and_503_and_dates_count_from_now() {
        let h = headers(&[("retry-after", "5")]);
        assert_eq!(advertised_wait(StatusCode::MOVED_PERMANENTLY, &h, 0), None);
        assert_eq!(advertised_wait(StatusCode::OK, &h, 0), None);
        let now_ms = 1_700_000_000_000;
        let date = httpdate::fmt_http_date(system_time(now_ms + 7_000));
        let h = headers(&[("retry-after", &date)]);
        assert_eq!(
            advertised_wait(StatusCode::TOO_MANY_REQUESTS, &h, now_ms),
            Some((Duration::from_secs(7), HoldReason::RetryAfter))
        );
        // A date already past asks for no wait.
        assert_eq!(
            advertised_wait(StatusCode::TOO_MANY_REQUESTS, &h, now_ms + 8_000),
            None
        );
    }

    #[test]
    fn units_left_bad_fields_and_pushback_without_a_capacity_refusal_ask_for_nothing() {
        for h in [
            headers(&[("ratelimit", r#""s";r=1;t=1"#)]),
            headers(&[("ratelimit", r#""s";r=0"#)]),
            headers(&[("ratelimit", "garbage;;")]),
            headers(&[("retry-after", "soon")]),
            headers(&[("grpc-retry-pushback-ms", "-1")]),
            headers(&[("grpc-retry-pushback-ms", "0")]),
            headers(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", "0")]),
            // "Do not retry" about the call itself, or after a success.
            headers(&[("grpc-status", "3"), ("grpc-retry-pushback-ms", "-1")]),
            headers(&[("grpc-status", "0"), ("grpc-retry-pushback-ms", "-1")]),
        ] {
            assert_eq!(
                advertised_wait(StatusCode::TOO_MANY_REQUESTS, &h, 0),
                None,
                "{h:?}"
            );
        }
        // r=0 counts on any status: the next call would be refused.
        let h = headers(&[("ratelimit", r#""s";r=0;t=1"#)]);
        assert_eq!(
            advertised_wait(StatusCode::OK, &h, 0),
            Some((Duration::from_secs(1), HoldReason::RateLimitHeader))
        );
    }

    #[test]
    fn do_not_retry_beside_a_capacity_refusal_asks_for_a_wait_with_no_end() {
        for (status, pushback) in [
            ("8", "-1"),
            ("14", "-2147483648"),
            ("8", "soon"),
            ("14", ""),
        ] {
            let h = headers(&[
                ("grpc-status", status),
                ("grpc-retry-pushback-ms", pushback),
            ]);
            assert_eq!(
                grpc_pushback(&h),
                Some((NO_END, HoldReason::GrpcNoRetry)),
                "{h:?}"
            );
            assert_eq!(
                advertised_wait(StatusCode::OK, &h, 0),
                Some((NO_END, HoldReason::GrpcNoRetry)),
                "{h:?}"
            );
        }
    }
}
