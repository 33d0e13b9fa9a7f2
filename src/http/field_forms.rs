//! The forms of the rate-limit fields that clients in the wild read, beside (or instead
//! of) draft 11's: draft 7's combined field, draft 6's three fields, and the
//! `X-RateLimit-*` headers of GitHub's API and many SDKs. Each of them carries one limit,
//! so they report the policy closest to refusing.

use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};

use crate::http::headers::RemainingCap;
use crate::http::response::{
    RATELIMIT, RATELIMIT_LIMIT, RATELIMIT_POLICY, RATELIMIT_REMAINING, RATELIMIT_RESET,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::limiter::decision::{PolicyReport, RateLimitInfo};

/// A form of the rate-limit fields a layer writes (see
/// [`RateLimitLayer::field_forms`](crate::RateLimitLayer::field_forms)).
///
/// ```
/// use tollgate::response::FieldForm;
/// assert_eq!(FieldForm::XRateLimit.as_str(), "x-ratelimit");
/// assert_eq!("draft-7".parse::<FieldForm>(), Ok(FieldForm::Draft7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FieldForm {
    /// Draft 11 (the default): `RateLimit-Policy: "per-second";q=50;w=1` and
    /// `RateLimit: "per-second";r=49;t=1`, one item per policy, as Structured Fields.
    Draft11,
    /// Draft 7's combined field, which has draft 11's name and so replaces it:
    /// `RateLimit-Policy: 50;w=1` and `RateLimit: limit=50, remaining=49, reset=1`.
    Draft7,
    /// Draft 6's three fields: `RateLimit-Policy: 50;w=1`, `RateLimit-Limit: 50`,
    /// `RateLimit-Remaining: 49`, `RateLimit-Reset: 1`.
    Draft6,
    /// `X-RateLimit-Limit: 50`, `X-RateLimit-Remaining: 49` and `X-RateLimit-Reset` as the
    /// Unix time (whole seconds) when it resets, as GitHub's API writes them.
    XRateLimit,
}

impl FieldForm {
    /// The form's name, as `--fields` lists take it: `draft-11`, `draft-7`, `draft-6` or
    /// `x-ratelimit`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FieldForm::Draft11 => "draft-11",
            FieldForm::Draft7 => "draft-7",
            FieldForm::Draft6 => "draft-6",
            FieldForm::XRateLimit => "x-ratelimit",
        }
    }

    fn bit(self) -> u8 {
        match self {
            FieldForm::Draft11 => 1,
            FieldForm::Draft7 => 2,
            FieldForm::Draft6 => 4,
            FieldForm::XRateLimit => 8,
        }
    }
}

/// A name that is not a form's.
///
/// ```
/// use tollgate::response::FieldForm;
/// let error = "draft-8".parse::<FieldForm>().unwrap_err();
/// assert!(error.to_string().contains("draft-8"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownFieldForm(String);

impl std::fmt::Display for UnknownFieldForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown field form {:?}: expected draft-11, draft-7, draft-6 or x-ratelimit",
            self.0
        )
    }
}

impl std::error::Error for UnknownFieldForm {}

impl std::str::FromStr for FieldForm {
    type Err = UnknownFieldForm;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "draft-11" => Ok(FieldForm::Draft11),
            "draft-7" => Ok(FieldForm::Draft7),
            "draft-6" => Ok(FieldForm::Draft6),
            "x-ratelimit" => Ok(FieldForm::XRateLimit),
            _ => Err(UnknownFieldForm(name.to_owned())),
        }
    }
}

/// The forms a layer writes, as a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FieldForms(u8);

impl Default for FieldForms {
    fn default() -> Self {
        Self(FieldForm::Draft11.bit())
    }
}

impl FieldForms {
    pub(crate) fn of(forms: impl IntoIterator<Item = FieldForm>) -> Self {
        Self(forms.into_iter().fold(0, |bits, form| bits | form.bit()))
    }

    /// Whether draft 11's fields are written: chosen, and not replaced by draft 7's.
    pub(crate) fn draft11(self) -> bool {
        self.has(FieldForm::Draft11) && !self.has(FieldForm::Draft7)
    }

    /// Whether any single-limit form is written.
    pub(crate) fn others(self) -> bool {
        self.0 & !FieldForm::Draft11.bit() != 0
    }

    fn has(self, form: FieldForm) -> bool {
        self.0 & form.bit() != 0
    }
}

/// One limit, as the single-limit forms carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OneLimit {
    pub(crate) limit: u64,
    pub(crate) window_secs: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_secs: u64,
}

impl OneLimit {
    /// The policy of `info` a client should heed: the first that refused, else the one
    /// with the least left (the first of those).
    pub(crate) fn of(info: &RateLimitInfo, cap: RemainingCap) -> Option<Self> {
        let chosen: PolicyReport<'_> = info
            .violated()
            .next()
            .or_else(|| info.policies().min_by_key(|p| cap.remaining(p)))?;
        Some(Self {
            limit: chosen.quota(),
            window_secs: chosen.window_secs(),
            remaining: cap.remaining(&chosen),
            reset_secs: chosen.reset_secs(),
        })
    }
}

/// Appends the single-limit forms of `forms` for `limit`.
pub(crate) fn append(headers: &mut HeaderMap, forms: FieldForms, limit: OneLimit) {
    let OneLimit {
        limit: q,
        window_secs,
        remaining,
        reset_secs,
    } = limit;
    let policy = || HeaderValue::from_str(&format!("{q};w={window_secs}")).ok();
    if forms.has(FieldForm::Draft7) {
        if let Some(value) = policy() {
            headers.append(RATELIMIT_POLICY, value);
        }
        let combined = format!("limit={q}, remaining={remaining}, reset={reset_secs}");
        if let Ok(value) = HeaderValue::from_str(&combined) {
            headers.append(RATELIMIT, value);
        }
    }
    if forms.has(FieldForm::Draft6) {
        // Draft 7 wrote the same policy field already.
        if !forms.has(FieldForm::Draft7)
            && let Some(value) = policy()
        {
            headers.append(RATELIMIT_POLICY, value);
        }
        headers.insert(RATELIMIT_LIMIT, HeaderValue::from(q));
        headers.insert(RATELIMIT_REMAINING, HeaderValue::from(remaining));
        headers.insert(RATELIMIT_RESET, HeaderValue::from(reset_secs));
    }
    if forms.has(FieldForm::XRateLimit) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(q));
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
        headers.insert(
            X_RATELIMIT_RESET,
            HeaderValue::from(now.saturating_add(reset_secs)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_writes_its_own_fields() {
        let limit = OneLimit {
            limit: 50,
            window_secs: 1,
            remaining: 49,
            reset_secs: 1,
        };
        let mut headers = HeaderMap::new();
        append(
            &mut headers,
            FieldForms::of([FieldForm::Draft7, FieldForm::Draft6, FieldForm::XRateLimit]),
            limit,
        );
        assert_eq!(headers["ratelimit"], "limit=50, remaining=49, reset=1");
        assert_eq!(headers.get_all("ratelimit-policy").iter().count(), 1);
        assert_eq!(headers["ratelimit-policy"], "50;w=1");
        assert_eq!(headers["ratelimit-limit"], "50");
        assert_eq!(headers["ratelimit-remaining"], "49");
        assert_eq!(headers["ratelimit-reset"], "1");
        assert_eq!(headers["x-ratelimit-limit"], "50");
        let reset: u64 = headers["x-ratelimit-reset"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!((now..=now + 2).contains(&reset));
        // Draft 7 replaces draft 11, which has its field's name.
        assert!(!FieldForms::of([FieldForm::Draft11, FieldForm::Draft7]).draft11());
        assert!(FieldForms::default().draft11() && !FieldForms::default().others());
    }
}
