//! Asking a limiter directly, below HTTP.

use tollgate::{Caller, Limiter};

/// A burst of `count` checks of `caller`, one after another: each must be admitted
/// (`what` and the attempt's index name the one that was not).
pub async fn admitted_burst(limiter: &Limiter, caller: &Caller, count: usize, what: &str) {
    for i in 0..count {
        let decision = limiter.check(caller).await;
        assert!(decision.is_allowed(), "{what} {i}: {decision:?}");
    }
}
