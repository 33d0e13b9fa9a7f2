//! The HTTP envelope of a refusal (an RFC 9457 problem+json body), and the RateLimit
//! fields on allowed responses.

use std::fmt::Write;

use bytes::Bytes;

use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::http::body::ResponseBody;
use crate::http::field_forms::{self, FieldForms, OneLimit};
use crate::http::headers::{HeaderMode, PolicyFieldCache, RemainingCap, state_field};
use crate::http::key::KeyRejection;
use crate::http::problem_type::ProblemType;
use crate::http::refusal::Refusal;
use crate::limiter::decision::{Decision, PolicyReport, RateLimitInfo};
use crate::store::policy::Policy;

/// The `RateLimit-Policy` field name.
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
// The single-limit forms' field names: draft 6's three fields and `X-RateLimit-*`.
pub(crate) const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
pub(crate) const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
pub(crate) const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(crate) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// What the RateLimit fields of one response are made with: the layer's settings and the
/// caller's partition key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields<'a> {
    pub(crate) mode: HeaderMode,
    pub(crate) forms: FieldForms,
    pub(crate) cache: &'a PolicyFieldCache,
    pub(crate) cap: RemainingCap,
    pub(crate) pk: Option<&'a [u8]>,
}

// Problem members are named as the draft names its own (`violated-policies`): lower case,
// words joined by hyphens.

/// The HTTP envelope of a refusal: its status and RFC 9457 problem body.
///
/// - Limited: 429, quota-exceeded, naming the violated policies.
/// - A cost no quota admits: 429, cost-exceeds-quota, naming the policy, the cost and the
///   quota (no Retry-After: waiting never helps).
/// - Fail closed: the layer's status (503 unless set), temporary-reduced-capacity, naming
///   every policy of the caller.
/// - A key rejection: its 4xx, `about:blank` with the rejection's detail.
pub(crate) fn problem_of(refusal: &Refusal<'_>) -> Response<Bytes> {
    let retry_after = refusal.retry_after_secs();
    let (status, body) = match refusal {
        Refusal::Limited(info) => limited(info, retry_after),
        Refusal::CostExceedsQuota { info, policy } => cost_exceeds_quota(info, policy),
        Refusal::Unavailable {
            status, policies, ..
        } => unavailable(*status, policies, retry_after),
        Refusal::Rejected(rejection) => rejected(rejection),
    };
    problem_bytes(status, body)
}

/// 429, quota-exceeded: the first violated policy, all of them, and when to retry.
fn limited(info: &RateLimitInfo, retry_after: Option<u64>) -> (StatusCode, String) {
    let status = StatusCode::TOO_MANY_REQUESTS;
    let violated: Vec<&str> = info.violated().map(|p| p.name()).collect();
    let mut body = problem_start(ProblemType::QuotaExceeded.uri(), "Quota exceeded", status);
    if let Some(first) = violated.first() {
        body.push_str(",\"policy\":");
        json_string(&mut body, first);
    }
    violated_and_retry(&mut body, &violated, retry_after);
    (status, body)
}

/// 429, cost-exceeds-quota: a detail in words, the policy, the cost and the quota, and no
/// retry (waiting never helps).
fn cost_exceeds_quota(info: &RateLimitInfo, policy: &PolicyReport<'_>) -> (StatusCode, String) {
    let status = StatusCode::TOO_MANY_REQUESTS;
    let violated: Vec<&str> = info.violated().map(|p| p.name()).collect();
    let mut body = problem_start(
        ProblemType::CostExceedsQuota.uri(),
        "Cost exceeds quota",
        status,
    );
    body.push_str(",\"detail\":");
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
        ",\"cost\":{},\"quota\":{}",
        info.cost(),
        policy.quota()
    );
    violated_and_retry(&mut body, &violated, None);
    (status, body)
}

/// The layer's fail-closed status, temporary-reduced-capacity: every policy of the caller,
/// and when to retry.
fn unavailable(
    status: StatusCode,
    policies: &[Policy],
    retry_after: Option<u64>,
) -> (StatusCode, String) {
    let names: Vec<&str> = policies.iter().map(Policy::name).collect();
    let mut body = problem_start(
        ProblemType::TemporaryReducedCapacity.uri(),
        "Temporary reduced capacity",
        status,
    );
    violated_and_retry(&mut body, &names, retry_after);
    (status, body)
}

/// The rejection's 4xx, `about:blank` titled by the status, with the rejection's detail.
fn rejected(rejection: &KeyRejection) -> (StatusCode, String) {
    let status = rejection.status();
    let title = status.canonical_reason().unwrap_or("Client error");
    let mut body = problem_start("about:blank", title, status);
    body.push_str(",\"detail\":");
    json_string(&mut body, rejection.detail());
    body.push('}');
    (status, body)
}

/// A request shed by the concurrency limit: 503, Retry-After, and the
/// temporary-reduced-capacity problem, which names no policy (no quota was exceeded).
pub(crate) fn overloaded<B>(retry_after_secs: u64) -> Response<ResponseBody<B>> {
    let retry_after = retry_after_secs.max(1);
    let status = StatusCode::SERVICE_UNAVAILABLE;
    let mut body = problem_start(
        ProblemType::TemporaryReducedCapacity.uri(),
        "Temporary reduced capacity",
        status,
    );
    let _ = write!(body, ",\"retry-after-seconds\":{retry_after}}}");
    let mut response = problem(status, body);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// A request refused because all of its caller's slots of the in-flight limit `policy`
/// are taken: 429, the quota-exceeded problem naming it, and Retry-After.
pub(crate) fn slots_taken<B>(policy: &str, retry_after_secs: u64) -> Response<ResponseBody<B>> {
    let status = StatusCode::TOO_MANY_REQUESTS;
    let mut body = problem_start(ProblemType::QuotaExceeded.uri(), "Quota exceeded", status);
    body.push_str(",\"policy\":");
    json_string(&mut body, policy);
    violated_and_retry(&mut body, &[policy], Some(retry_after_secs));
    let mut response = problem(status, body);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    response
}

/// `{"type":…,"title":…,"status":…`: how every problem body starts, left open for the
/// members of its kind.
fn problem_start(problem_type: &str, title: &str, status: StatusCode) -> String {
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json_string(&mut body, problem_type);
    body.push_str(",\"title\":");
    json_string(&mut body, title);
    let _ = write!(body, ",\"status\":{}", status.as_u16());
    body
}

/// `,"violated-policies":[...]` and, when waiting helps, `,"retry-after-seconds":N`, then
/// the closing brace: the end of every refusal's body but a key rejection's.
fn violated_and_retry(body: &mut String, violated: &[&str], retry_after: Option<u64>) {
    body.push_str(",\"violated-policies\":[");
    for (i, name) in violated.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        json_string(body, name);
    }
    body.push(']');
    if let Some(secs) = retry_after {
        let _ = write!(body, ",\"retry-after-seconds\":{secs}");
    }
    body.push('}');
}

/// Adds RateLimit-Policy and RateLimit (every policy) to an allowed response of `status`.
pub(crate) fn decorate_allowed(
    headers: &mut HeaderMap,
    status: StatusCode,
    decision: &Decision,
    fields: Fields<'_>,
) {
    if let Decision::Allowed(info) | Decision::SoftLimited(info) = decision
        && fields.mode.on_allowed(status)
    {
        if fields.forms.draft11() {
            Draft11Fields::of(info, fields).append_to(headers);
        }
        if fields.forms.others()
            && let Some(limit) = OneLimit::of(info, fields.cap)
        {
            field_forms::append(headers, fields.forms, limit);
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields of an admitted request, written while the
/// layer's settings are at hand, so that a response that gets nothing else needs only
/// these (and the header mode that says which statuses get them), not the settings or the
/// decision.
#[derive(Debug)]
pub(crate) struct Draft11Fields {
    mode: HeaderMode,
    policy: Option<HeaderValue>,
    state: Option<HeaderValue>,
}

impl Draft11Fields {
    /// `info`'s fields, as `fields` says to write them.
    pub(crate) fn of(info: &RateLimitInfo, fields: Fields<'_>) -> Self {
        Self {
            mode: fields.mode,
            policy: fields.cache.get(info, fields.pk),
            state: state_field(info.policies(), fields.cap, fields.pk),
        }
    }

    /// Whether an admitted response of `status` gets the fields.
    pub(crate) fn on_allowed(&self, status: StatusCode) -> bool {
        self.mode.on_allowed(status)
    }

    /// Appends the fields to `headers`: appended, not inserted, so that a response that
    /// already lists an inner layer's policies lists both layers'.
    pub(crate) fn append_to(self, headers: &mut HeaderMap) {
        if let Some(policy) = self.policy {
            headers.append(RATELIMIT_POLICY, policy);
        }
        if let Some(state) = self.state {
            headers.append(RATELIMIT, state);
        }
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
