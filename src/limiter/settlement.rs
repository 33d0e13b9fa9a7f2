//! Settling an admitted request at what it turned out to cost: the difference from what it
//! reserved, given back or charged where the reservation was counted.

use crate::store::backend::CheckOutcome;

/// What [`Limiter::settle`](crate::Limiter::settle) did with a request admitted for
/// `reserved` units that cost `actual`: the difference given back (it cost less) or
/// charged (it cost more, past the quota if need be, a debt that later requests wait out).
///
/// ```
/// use tollgate::{Caller, Limiter, Policy, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let tokens = Limiter::builder()
///     .policy(Policy::sliding_window("tokens", Quota::per_minute(1_000)))
///     .build();
/// let acme = Caller::new("acme");
/// // Reserved at the request's max_tokens, 300; the answer used 120.
/// let admitted = tokens.check_cost(&acme, 300).await;
/// let settled = tokens.settle(&acme, &admitted, 120).await.unwrap();
/// assert_eq!((settled.reserved(), settled.refunded(), settled.charged()), (300, 180, 0));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    reserved: u64,
    actual: u64,
    counted: bool,
    after: Option<CheckOutcome>,
}

impl Settlement {
    pub(crate) fn new(reserved: u64, actual: u64, after: Option<CheckOutcome>) -> Self {
        Self {
            reserved,
            actual,
            counted: true,
            after,
        }
    }

    /// A request that counted nothing (refused, let through uncounted, failed open): there
    /// is nothing to settle.
    pub(crate) fn not_counted(actual: u64) -> Self {
        Self {
            reserved: 0,
            actual,
            counted: false,
            after: None,
        }
    }

    /// The units the request was admitted for (0 when it counted nothing).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// What the request turned out to cost.
    pub fn actual(&self) -> u64 {
        self.actual
    }

    /// Whether the request had counted units to settle: `false` for a request refused, let
    /// through without a count (fail open, the off mode), or not yet admitted.
    pub fn counted(&self) -> bool {
        self.counted
    }

    /// The units given back: what was reserved and not used.
    pub fn refunded(&self) -> u64 {
        if self.counted {
            self.reserved.saturating_sub(self.actual)
        } else {
            0
        }
    }

    /// The units charged beyond the reservation, past the quota if need be.
    pub fn charged(&self) -> u64 {
        if self.counted {
            self.actual.saturating_sub(self.reserved)
        } else {
            0
        }
    }

    /// What each policy reported once the extra units were charged: what remains and,
    /// when nothing does (a caller in debt), how long until one unit fits. `None` when
    /// nothing was charged.
    pub fn after_charge(&self) -> Option<&CheckOutcome> {
        self.after.as_ref()
    }
}
