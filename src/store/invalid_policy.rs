//! Why a policy cannot be built: the typed error of the fallible constructors, for
//! policies read at run time.

use std::fmt;

/// Why [`Policy::try_new`](crate::Policy::try_new) or an
/// [`Algorithm`](crate::store::Algorithm) `try_` constructor refused its arguments.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::{Algorithm, InvalidPolicy};
///
/// let error = Algorithm::try_sliding_window(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(error, InvalidPolicy::ZeroLimit);
/// assert_eq!(error.to_string(), "a sliding window or log needs a limit of at least 1");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidPolicy {
    /// The name is empty, longer than 64 bytes, or not printable ASCII (it appears in HTTP
    /// headers and store keys).
    Name(String),
    /// A sliding window's or sliding log's limit is zero.
    ZeroLimit,
    /// A token bucket's rate is zero.
    ZeroRate,
    /// A token bucket's burst is zero.
    ZeroBurst,
    /// The window or refill period is under one millisecond.
    ShortPeriod,
    /// The limit (or rate, or burst) times the window (or period) in milliseconds reaches
    /// 2^53, beyond exact arithmetic in Redis's Lua.
    Inexact,
    /// A sliding log's limit is above the most it keeps per caller: it stores one entry per
    /// admitted unit ([`Algorithm::MAX_LOG_LIMIT`](crate::store::Algorithm::MAX_LOG_LIMIT)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::{Algorithm, InvalidPolicy};
    /// let error = Algorithm::try_sliding_log(50_000, Duration::from_secs(1)).unwrap_err();
    /// assert_eq!(error, InvalidPolicy::LogTooLarge { limit: 50_000, max: 10_000 });
    /// assert_eq!(
    ///     error.to_string(),
    ///     "a sliding log keeps one entry per admitted unit: its limit must be at most 10000, got 50000"
    /// );
    /// ```
    LogTooLarge {
        /// The limit asked for.
        limit: u64,
        /// The largest limit a sliding log takes.
        max: u64,
    },
}

impl fmt::Display for InvalidPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidPolicy::Name(name) => write!(
                f,
                "a policy name must be 1 to 64 printable ASCII characters, got {name:?}"
            ),
            InvalidPolicy::ZeroLimit => {
                f.write_str("a sliding window or log needs a limit of at least 1")
            }
            InvalidPolicy::ZeroRate => f.write_str("a token bucket needs a rate of at least 1"),
            InvalidPolicy::ZeroBurst => f.write_str("a token bucket needs a burst of at least 1"),
            InvalidPolicy::ShortPeriod => {
                f.write_str("a window or refill period must be at least 1 ms")
            }
            InvalidPolicy::Inexact => {
                f.write_str("the count times the window or period (ms) must stay below 2^53")
            }
            InvalidPolicy::LogTooLarge { limit, max } => write!(
                f,
                "a sliding log keeps one entry per admitted unit: its limit must be at most {max}, got {limit}"
            ),
        }
    }
}

impl std::error::Error for InvalidPolicy {}
