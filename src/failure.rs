//! What a limiter does when its store cannot decide.

use std::time::Duration;

/// The choice made for a route when the store fails: allow or refuse.
///
/// ```
/// use std::time::Duration;
/// use tollgate::FailurePolicy;
///
/// let orders = FailurePolicy::Open;
/// let login = FailurePolicy::closed().retry_after(Duration::from_secs(5));
/// # drop((orders, login));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through uncounted.
    #[default]
    Open,
    /// Refuse with `status` (503 by default) and `Retry-After`.
    Closed {
        /// The refusal status: 503 unless set, never 500.
        status: u16,
        /// What Retry-After says, rounded up to whole seconds (at least 1).
        retry_after: Duration,
    },
}

impl FailurePolicy {
    /// Refuse with 503 and `Retry-After: 1`.
    pub fn closed() -> Self {
        FailurePolicy::Closed {
            status: 503,
            retry_after: Duration::from_secs(1),
        }
    }

    /// Sets the refusal status of [`FailurePolicy::Closed`]; anything but a 4xx or 5xx
    /// status, and 500 itself, is taken as 503. No effect on other policies.
    ///
    /// ```
    /// use tollgate::FailurePolicy;
    /// let p = FailurePolicy::closed().status(429);
    /// assert!(matches!(p, FailurePolicy::Closed { status: 429, .. }));
    /// let p = FailurePolicy::closed().status(500);
    /// assert!(matches!(p, FailurePolicy::Closed { status: 503, .. }));
    /// ```
    pub fn status(self, status: u16) -> Self {
        match self {
            FailurePolicy::Closed { retry_after, .. } => {
                let status = if (400..600).contains(&status) && status != 500 {
                    status
                } else {
                    503
                };
                FailurePolicy::Closed {
                    status,
                    retry_after,
                }
            }
            other => other,
        }
    }

    /// Sets what Retry-After says on a fail-closed refusal. No effect on other policies.
    pub fn retry_after(self, retry_after: Duration) -> Self {
        match self {
            FailurePolicy::Closed { status, .. } => FailurePolicy::Closed {
                status,
                retry_after,
            },
            other => other,
        }
    }
}
