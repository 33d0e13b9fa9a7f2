//! Requests that cost more than a policy's quota: no wait would ever admit them, so they
//! are refused without asking the store.

use crate::limiter::decision::{Decision, DecisionSource, RateLimitInfo};
use crate::limiter::policy_set::PolicySet;
use crate::store::algorithm::PolicyOutcome;

impl PolicySet {
    /// The refusal of a request of `cost` units when some policy's quota is below it:
    /// those policies refuse, `r` and `t` unknown (0), nothing consumed.
    // Inlined: the usual request of one unit costs one comparison, not a call.
    #[inline]
    pub(crate) fn unaffordable(&self, cost: u64) -> Option<Decision> {
        // One unit always fits a quota: the common case costs one comparison per policy.
        if cost <= 1 || self.limits.iter().all(|p| p.algorithm().quota() >= cost) {
            return None;
        }
        self.refusal_of_cost(cost)
    }

    #[cold]
    fn refusal_of_cost(&self, cost: u64) -> Option<Decision> {
        let outcomes: Vec<PolicyOutcome> = self
            .limits
            .iter()
            .map(|policy| PolicyOutcome {
                admitted: policy.algorithm().quota() >= cost,
                remaining: 0,
                reset_ms: 0,
            })
            .collect();
        let info = RateLimitInfo::of_store(
            self.reported.clone(),
            &outcomes,
            DecisionSource::Cost,
            cost,
            None,
        );
        Some(Decision::Limited(info))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::policy::{Policy, Quota};

    #[test]
    fn only_a_cost_above_a_quota_is_unaffordable() {
        let scope: Arc<str> = Arc::from("batch");
        let set = PolicySet::new(
            None,
            &[
                Policy::sliding_window("per-second", Quota::per_second(50)),
                Policy::sliding_window("per-minute", Quota::per_minute(1_000)),
            ],
            &scope,
            0,
        )
        .expect("valid set");
        assert!(set.unaffordable(0).is_none());
        assert!(set.unaffordable(50).is_none());
        let Some(Decision::Limited(info)) = set.unaffordable(51) else {
            panic!("51 units never fit in 50");
        };
        assert_eq!(info.cost(), 51);
        assert_eq!(info.source(), DecisionSource::Cost);
        let violated: Vec<&str> = info.violated().map(|p| p.name()).collect();
        assert_eq!(violated, ["per-second"]);
        assert_eq!(info.unaffordable().map(|p| p.quota()), Some(50));
    }
}
