//! Refusals as RFC 9457 problem+json responses, and the headers on allowed ones.

use std::fmt::Write;

use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::http::body::ResponseBody;
use crate::http::headers::{HeaderMode, PolicyFieldCache, state_field};
use crate::http::key::KeyRejection;
use crate::limiter::decision::{Decision, RateLimitInfo};

/// The `RateLimit-Policy` field name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The problem type of a 429, as the IETF RateLimit draft registers it.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The problem type of a fail-closed refusal.
pub const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// 429 with RateLimit-Policy, RateLimit (the exhausted policies), Retry-After and a
/// quota-exceeded problem naming the violated policies.
pub(crate) fn limited<B>(
    info: &RateLimitInfo,
    mode: HeaderMode,
    policy_fields: &PolicyFieldCache,
) -> Response<ResponseBody<B>> {
    let retry_after = info.retry_after_secs().max(1);
    let violated: Vec<&str> = info.violated().map(|p| p.name()).collect();
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json_string(&mut body, QUOTA_EXCEEDED);
    body.push_str(",\"title\":\"Rate limit exceeded\",\"status\":429");
    if let Some(first) = violated.first() {
        body.push_str(",\"policy\":");
        json_string(&mut body, first);
    }
    body.push_str(",\"violated-policies\":[");
    for (i, name) in violated.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        json_string(&mut body, name);
    }
    let _ = write!(body, "],\"retry_after_seconds\":{retry_after}}}");

    let mut response = problem(StatusCode::TOO_MANY_REQUESTS, body);
    let headers = response.headers_mut();
    if mode.on_refused() {
        insert_policy_fields(headers, info, info.violated(), policy_fields);
    }
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// A fail-closed refusal: 503 (or the configured status, already mended by the layer),
/// Retry-After, and the temporary-reduced-capacity problem.
pub(crate) fn unavailable<B>(
    status: StatusCode,
    retry_after_secs: u64,
) -> Response<ResponseBody<B>> {
    let retry_after = retry_after_secs.max(1);
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json_string(&mut body, TEMPORARY_REDUCED_CAPACITY);
    let _ = write!(
        body,
        ",\"title\":\"Temporarily reduced capacity\",\"status\":{},\"retry_after_seconds\":{retry_after}}}",
        status.as_u16()
    );
    let mut response = problem(status, body);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// A request the key extractor refused, or one without a key when the layer rejects those.
pub(crate) fn rejected<B>(rejection: &KeyRejection) -> Response<ResponseBody<B>> {
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
    problem(status, body)
}

/// Adds RateLimit-Policy and RateLimit (every policy) to an allowed response.
pub(crate) fn decorate_allowed(
    headers: &mut HeaderMap,
    decision: &Decision,
    mode: HeaderMode,
    policy_fields: &PolicyFieldCache,
) {
    if let Decision::Allowed(info) = decision
        && mode.on_allowed()
    {
        insert_policy_fields(headers, info, info.policies(), policy_fields);
    }
}

fn insert_policy_fields<'a>(
    headers: &mut HeaderMap,
    info: &RateLimitInfo,
    reported: impl IntoIterator<Item = &'a crate::limiter::decision::PolicyReport>,
    policy_fields: &PolicyFieldCache,
) {
    // Appended, not inserted: Structured Field lists may span several field lines, so a
    // response that already lists an inner layer's policies lists both layers'.
    if let Some(policy) = policy_fields.get(info) {
        headers.append(RATELIMIT_POLICY, policy);
    }
    if let Some(state) = state_field(reported) {
        headers.append(RATELIMIT, state);
    }
}

fn problem<B>(status: StatusCode, body: String) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::full(body));
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
