//! `Retry-After`, readable, for the hold-back client layer: the `headers` crate's own type
//! can be built and written but not read back (it has no accessor).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderName, HeaderValue};

/// The `Retry-After` field (RFC 9110, section 10.2.3): a delay in whole seconds or an
/// HTTP date. [`wait_from`](RetryAfter::wait_from) says how long it asks to wait.
///
/// A [`headers::Header`] too, so that the tests can write a value and read it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RetryAfter {
    after: After,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    Delay(u64),
    /// Seconds since the Unix epoch.
    Date(u64),
}

impl RetryAfter {
    /// A delay, in whole seconds (rounded up, so that a client never calls early).
    // Only the tests build one: the layer writes its Retry-After as plain seconds.
    #[cfg(test)]
    pub(crate) fn from_delay(delay: Duration) -> Self {
        let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        Self {
            after: After::Delay(secs),
        }
    }

    /// A date, in whole seconds (rounded down, as an HTTP date holds it).
    pub(crate) fn from_date(date: SystemTime) -> Self {
        let secs = date
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        Self {
            after: After::Date(secs),
        }
    }

    /// How long to wait when the response arrived at `now`: the delay, or the time from
    /// `now` to the date (zero for a date already past).
    pub(crate) fn wait_from(&self, now: SystemTime) -> Duration {
        match self.after {
            After::Delay(secs) => Duration::from_secs(secs),
            After::Date(secs) => (UNIX_EPOCH + Duration::from_secs(secs))
                .duration_since(now)
                .unwrap_or(Duration::ZERO),
        }
    }

    /// Decodes a field value, as [`decode`](headers::Header::decode) does: whole seconds
    /// (digits only) or an HTTP date in any of the three forms RFC 9110 lets a recipient
    /// accept. Anything else is an error.
    pub(crate) fn parse(value: &[u8]) -> Result<Self, headers::Error> {
        let value = value.trim_ascii();
        if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
            // More digits than a u64 holds: as good as forever.
            let secs = std::str::from_utf8(value)
                .ok()
                .and_then(|digits| digits.parse().ok())
                .unwrap_or(u64::MAX);
            return Ok(Self {
                after: After::Delay(secs),
            });
        }
        std::str::from_utf8(value)
            .ok()
            .and_then(|text| httpdate::parse_http_date(text).ok())
            .map(Self::from_date)
            // Neither seconds nor a date: no more to say than the error does.
            .ok_or_else(headers::Error::invalid)
    }
}

impl headers::Header for RetryAfter {
    fn name() -> &'static HeaderName {
        &RETRY_AFTER
    }

    fn decode<'i, I>(values: &mut I) -> Result<Self, headers::Error>
    where
        I: Iterator<Item = &'i HeaderValue>,
    {
        let value = values.next().ok_or_else(headers::Error::invalid)?;
        Self::parse(value.as_bytes())
    }

    fn encode<E: Extend<HeaderValue>>(&self, values: &mut E) {
        let value = match self.after {
            After::Delay(secs) => HeaderValue::from(secs),
            After::Date(secs) => {
                let date = UNIX_EPOCH + Duration::from_secs(secs);
                // An HTTP date is printable ASCII.
                match HeaderValue::from_str(&httpdate::fmt_http_date(date)) {
                    Ok(value) => value,
                    Err(_) => return,
                }
            }
        };
        values.extend(std::iter::once(value));
    }
}
