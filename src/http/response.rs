//! Refusals as RFC 9457 problem+json responses, and the headers on allowed ones.

use std::fmt::Write;

use bytes::Bytes;

use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::http::body::ResponseBody;
use crate::http::headers::{
    HeaderMode, PolicyFieldCache, RemainingCap, policy_field_of, state_field, state_field_of,
};
use crate::http::key::KeyRejection;
use crate::limiter::decision::{Decision, PolicyReport, RateLimitInfo, whole_seconds};
use crate::store::policy::Policy;

/// The `RateLimit-Policy` field name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The problem type of a 429, as the IETF RateLimit draft registers it.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The problem type of a fail-closed refusal.
pub const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// The problem type of a request whose cost exceeds a policy's quota: no wait would ever
/// admit it, so the 429 that carries it has no Retry-After. Its members: `policy` (the
/// first such policy), `cost`, `quota` and `violated-policies`.
pub const COST_EXCEEDS_QUOTA: &str =
    "https://docs.rs/tollgate/latest/tollgate/response/constant.COST_EXCEEDS_QUOTA.html";

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// What the RateLimit fields of one response are made with: the layer's settings and the
/// caller's partition key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields<'a> {
    pub(crate) mode: HeaderMode,
    pub(crate) cache: &'a PolicyFieldCache,
    pub(crate) cap: RemainingCap,
    pub(crate) pk: Option<&'a [u8]>,
}

// Problem members are named as the draft names its own (`violated-policies`): lower case,
// words joined by hyphens.

/// 429 with RateLimit-Policy, RateLimit (the exhausted policies), Retry-After and a
/// quota-exceeded problem naming the violated policies.
pub(crate) fn limited(info: &RateLimitInfo, fields: Fields<'_>) -> Response<Bytes> {
    let retry_after = info.retry_after_secs().max(1);
    let violated: Vec<&str> = info.violated().map(|p| p.name()).collect();
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json_string(&mut body, QUOTA_EXCEEDED);
    body.push_str(",\"title\":\"Quota exceeded\",\"status\":429");
    if let Some(first) = violated.first() {
        body.push_str(",\"policy\":");
        json_string(&mut body, first);
    }
    violated_and_retry(&mut body, &violated, retry_after);

    let mut response = problem_bytes(StatusCode::TOO_MANY_REQUESTS, body);
    let headers = response.headers_mut();
    if fields.mode.on_refused() {
        insert_policy_fields(headers, info, info.violated(), fields);
    }
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// 429 for a request that costs more than a policy's quota: RateLimit-Policy, the
/// cost-exceeds-quota problem naming the policy, the cost and the quota, and no
/// Retry-After (waiting never helps) nor RateLimit (the store was not asked, so `r` is not
/// known).
pub(crate) fn cost_exceeds_quota(
    info: &RateLimitInfo,
    policy: &PolicyReport<'_>,
    fields: Fields<'_>,
) -> Response<Bytes> {
    let violated: Vec<&str> = info.violated().map(|p| p.name()).collect();
    let mut body = String::with_capacity(320);
    body.push_str("{\"type\":");
    json_string(&mut body, COST_EXCEEDS_QUOTA);
    body.push_str(",\"title\":\"Cost exceeds quota\",\"status\":429,\"detail\":");
    json_string(
        &mut body,
        &format!(
            "the request costs {} units, more than the {} that policy {:?} admits in a \
             window: waiting does not help, a smaller request may",
            info.cost(),
            policy.quota(),
            policy.name()
        ),
    );
    body.push_str(",\"policy\":");
    json_string(&mut body, policy.name());
    let _ = write!(
        body,
        ",\"cost\":{},\"quota\":{},\"violated-policies\":[",
        info.cost(),
        policy.quota()
    );
    for (i, name) in violated.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        json_string(&mut body, name);
    }
    body.push_str("]}");
    let mut response = problem_bytes(StatusCode::TOO_MANY_REQUESTS, body);
    if fields.mode.on_refused()
        && let Some(policy) = fields.cache.get(info, fields.pk)
    {
        response.headers_mut().append(RATELIMIT_POLICY, policy);
    }
    response
}

/// A fail-closed refusal: 503 (or the configured status, already mended by the layer),
/// Retry-After, and the temporary-reduced-capacity problem naming every policy of the
/// caller. RateLimit-Policy advertises the reduced quota, nothing (`q=0`) in each window,
/// and RateLimit `r=0` until the retry time.
pub(crate) fn unavailable(
    status: StatusCode,
    retry_after_secs: u64,
    policies: &[Policy],
    fields: Fields<'_>,
) -> Response<Bytes> {
    let retry_after = retry_after_secs.max(1);
    let names: Vec<&str> = policies.iter().map(Policy::name).collect();
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json_string(&mut body, TEMPORARY_REDUCED_CAPACITY);
    let _ = write!(
        body,
        ",\"title\":\"Temporary reduced capacity\",\"status\":{}",
        status.as_u16()
    );
    violated_and_retry(&mut body, &names, retry_after);
    let mut response = problem_bytes(status, body);
    let headers = response.headers_mut();
    if fields.mode.on_refused() {
        insert_reduced_fields(headers, policies, retry_after, fields);
    }
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// The fields of a fail-closed refusal: RateLimit-Policy advertises nothing (`q=0`) in
/// each window, and RateLimit `r=0` until `retry_after` (whole seconds).
pub(crate) fn insert_reduced_fields(
    headers: &mut HeaderMap,
    policies: &[Policy],
    retry_after: u64,
    fields: Fields<'_>,
) {
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

/// A request shed by the concurrency limit: 503, Retry-After, and the
/// temporary-reduced-capacity problem, which names no policy (no quota was exceeded).
pub(crate) fn overloaded<B>(retry_after_secs: u64) -> Response<ResponseBody<B>> {
    let retry_after = retry_after_secs.max(1);
    let mut body = String::with_capacity(192);
    body.push_str("{\"type\":");
    json_string(&mut body, TEMPORARY_REDUCED_CAPACITY);
    let _ = write!(
        body,
        ",\"title\":\"Temporary reduced capacity\",\"status\":503,\"retry-after-seconds\":{retry_after}}}"
    );
    let mut response = problem(StatusCode::SERVICE_UNAVAILABLE, body);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// `,"violated-policies":[...],"retry-after-seconds":N}`: the end of both refusals' bodies.
fn violated_and_retry(body: &mut String, violated: &[&str], retry_after: u64) {
    body.push_str(",\"violated-policies\":[");
    for (i, name) in violated.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        json_string(body, name);
    }
    let _ = write!(body, "],\"retry-after-seconds\":{retry_after}}}");
}

/// A request the key extractor refused, or one without a key when the layer rejects those.
pub(crate) fn rejected(rejection: &KeyRejection) -> Response<Bytes> {
    let status = rejection.status();
    let mut body = String::with_capacity(128);
    body.push_str("{\"type\":\"about:blank\",\"title\":");
    json_string(
        &mut body,
        status.canonical_reason().unwrap_or("Client error"),
    );
    let _ = write!(body, ",\"status\":{},\"detail\":", status.as_u16());
    json_string(&mut body, rejection.detail());
    body.push('}');
    problem_bytes(status, body)
}

/// Adds RateLimit-Policy and RateLimit (every policy) to an allowed response of `status`.
pub(crate) fn decorate_allowed(
    headers: &mut HeaderMap,
    status: StatusCode,
    decision: &Decision,
    fields: Fields<'_>,
) {
    if let Decision::Allowed(info) = decision
        && fields.mode.on_allowed(status)
    {
        insert_policy_fields(headers, info, info.policies(), fields);
    }
}

/// Adds RateLimit-Policy (every policy) and RateLimit (the `reported` ones).
pub(crate) fn insert_policy_fields<'a>(
    headers: &mut HeaderMap,
    info: &RateLimitInfo,
    reported: impl IntoIterator<Item = PolicyReport<'a>>,
    fields: Fields<'_>,
) {
    // Appended, not inserted: Structured Field lists may span several field lines, so a
    // response that already lists an inner layer's policies lists both layers'.
    if let Some(policy) = fields.cache.get(info, fields.pk) {
        headers.append(RATELIMIT_POLICY, policy);
    }
    if let Some(state) = state_field(reported, fields.cap, fields.pk) {
        headers.append(RATELIMIT, state);
    }
}

fn problem<B>(status: StatusCode, body: String) -> Response<ResponseBody<B>> {
    problem_bytes(status, body).map(ResponseBody::full)
}

fn problem_bytes(status: StatusCode, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// Writes `value` as a JSON string.
fn json_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_escape() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\n");
        assert_eq!(out, r#""a\"b\\c\u000a""#);
    }
}
