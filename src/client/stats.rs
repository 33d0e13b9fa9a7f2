//! What a window holds: the counts and the rejection probability they give.

/// The counts in an adaptive throttle's window and the rejection probability they give,
/// read together under the window's lock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ThrottleStats {
    pub(super) requests: u64,
    pub(super) accepts: u64,
    pub(super) probability: f64,
}
