//! `Retry-After`, readable: the `headers` crate's own type can be built and written but not
//! read back (it has no accessor), which a client that honours it needs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderName, HeaderValue};

/// The `Retry-After` field (RFC 9110, section 10.2.3): a delay in whole seconds or an
/// HTTP date.
///
/// A [`headers::Header`]. Unlike `headers::RetryAfter`, its value can be read:
/// [`delay`](RetryAfter::delay), [`date`](RetryAfter::date), and
/// [`wait_from`](RetryAfter::wait_from) for how long to wait from a given time.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use headers::HeaderMapExt;
/// use tollgate::headers::RetryAfter;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("retry-after", "120".parse().unwrap());
/// let after: RetryAfter = headers.typed_get().unwrap();
/// assert_eq!(after.delay(), Some(Duration::from_secs(120)));
///
/// headers.insert("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap());
/// let after: RetryAfter = headers.typed_get().unwrap();
/// let date = after.date().unwrap();
/// assert_eq!(after.wait_from(date - Duration::from_secs(5)), Duration::from_secs(5));
/// assert_eq!(after.wait_from(date + Duration::from_secs(5)), Duration::ZERO);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryAfter {
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
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::headers::RetryAfter;
    /// assert_eq!(RetryAfter::from_delay(Duration::from_millis(1_200)).delay(), Some(Duration::from_secs(2)));
    /// ```
    pub fn from_delay(delay: Duration) -> Self {
        let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        Self {
            after: After::Delay(secs),
        }
    }

    /// A date, in whole seconds (rounded down, as an HTTP date holds it).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tollgate::headers::RetryAfter;
    /// let date = UNIX_EPOCH + Duration::from_millis(1_700_000_000_900);
    /// assert_eq!(RetryAfter::from_date(date).date(), Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
    /// ```
    pub fn from_date(date: SystemTime) -> Self {
        let secs = date
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        Self {
            after: After::Date(secs),
        }
    }

    /// The delay, if the field is one.
    ///
    /// ```
    /// use tollgate::headers::RetryAfter;
    /// assert_eq!(RetryAfter::from_date(std::time::SystemTime::now()).delay(), None);
    /// ```
    pub fn delay(&self) -> Option<Duration> {
        match self.after {
            After::Delay(secs) => Some(Duration::from_secs(secs)),
            After::Date(_) => None,
        }
    }

    /// The date, if the field is one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::headers::RetryAfter;
    /// assert_eq!(RetryAfter::from_delay(Duration::from_secs(1)).date(), None);
    /// ```
    pub fn date(&self) -> Option<SystemTime> {
        match self.after {
            After::Delay(_) => None,
            After::Date(secs) => Some(UNIX_EPOCH + Duration::from_secs(secs)),
        }
    }

    /// How long to wait when the response arrived at `now`: the delay, or the time from
    /// `now` to the date (zero for a date already past).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tollgate::headers::RetryAfter;
    /// let after = RetryAfter::from_delay(Duration::from_secs(3));
    /// assert_eq!(after.wait_from(SystemTime::now()), Duration::from_secs(3));
    /// ```
    pub fn wait_from(&self, now: SystemTime) -> Duration {
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
    ///
    /// ```
    /// use tollgate::headers::RetryAfter;
    /// assert!(RetryAfter::parse(b"5").is_ok());
    /// assert!(RetryAfter::parse(b"Sunday, 06-Nov-94 08:49:37 GMT").is_ok());
    /// assert!(RetryAfter::parse(b"-5").is_err());
    /// assert!(RetryAfter::parse(b"soon").is_err());
    /// ```
    pub fn parse(value: &[u8]) -> Result<Self, headers::Error> {
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
