//! What a window holds: the counts and the rejection probability they give.

/// The counts in an adaptive throttle's window and the rejection probability they give.
///
/// ```
/// use tollgate::client::AdaptiveThrottleLayer;
///
/// let stats = AdaptiveThrottleLayer::new().stats();
/// assert_eq!(stats.requests(), 0);
/// assert_eq!(stats.accepts(), 0);
/// assert_eq!(stats.rejection_probability(), 0.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottleStats {
    pub(super) requests: u64,
    pub(super) accepts: u64,
    pub(super) probability: f64,
}

impl ThrottleStats {
    /// Requests attempted in the window, locally rejected ones included.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().stats().requests(), 0);
    /// ```
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Requests in the window that the backend accepted.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().stats().accepts(), 0);
    /// ```
    pub fn accepts(&self) -> u64 {
        self.accepts
    }

    /// `max(0, (requests - K * accepts) / (requests + 1))`: the probability that the next
    /// request is rejected locally.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().stats().rejection_probability(), 0.0);
    /// ```
    pub fn rejection_probability(&self) -> f64 {
        self.probability
    }
}
