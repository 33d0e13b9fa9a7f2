//! The policy sets a limiter decides callers against: the defaults and each tier's.

use std::sync::{Arc, OnceLock};

use crate::limiter::failure::ShareSet;
use crate::limiter::reported_set::ReportedSet;
use crate::store::build_error::BuildError;
use crate::store::policy::Policy;

/// One set of policies a caller is decided against (the defaults, or a tier's), with an
/// identity that changes whenever any of its policies does, and at every swap of the
/// limiter's limits: a refusal is remembered for the set that refused, so a caller moved
/// to another tier, or decided under new limits, is asked about afresh.
#[derive(Clone, Debug)]
pub(crate) struct PolicySet {
    pub(crate) limits: Arc<[Policy]>,
    /// The same policies, as the decisions made against them hold them.
    pub(crate) reported: ReportedSet,
    pub(crate) id: u64,
    /// Whether a policy of the set locks out: its callers are decided by the store on
    /// every request, never from a lease, so that the block starts when the quota is
    /// used up and every instance sees it.
    pub(crate) locks_out: bool,
    /// This set divided among the instances, as a local share first resolved it: the
    /// requests after it that find the same instance count decide against it without
    /// looking among every divided set.
    pub(in crate::limiter) share: OnceLock<Arc<ShareSet>>,
}

impl PolicySet {
    /// This set with `quotas` (a caller's own, by policy name) in place of its policies'
    /// quotas; the counters are the same (a quota is not part of a counter's identity).
    pub(crate) fn with_quotas(&self, quotas: &[(Arc<str>, u64)]) -> Self {
        let limits: Arc<[Policy]> = self
            .limits
            .iter()
            .map(|policy| {
                match quotas
                    .iter()
                    .rev()
                    .find(|(name, _)| name == policy.name_arc())
                {
                    Some((_, quota)) => {
                        policy.with_algorithm(policy.algorithm().with_quota(*quota))
                    }
                    None => policy.clone(),
                }
            })
            .collect();
        let id = std::hash::BuildHasher::hash_one(
            &std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default(),
            (self.id, &*limits),
        );
        Self {
            reported: ReportedSet::store_plan(&limits),
            limits,
            id,
            locks_out: self.locks_out,
            share: OnceLock::new(),
        }
    }

    /// The set of a member of nested budgets (see `ActiveLimits::nested`), derived from
    /// `set`: its identity is the policies' own, which name the member.
    pub(crate) fn nested(set: &PolicySet, limits: Arc<[Policy]>) -> Self {
        let id = std::hash::BuildHasher::hash_one(
            &std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default(),
            (set.id, &*limits),
        );
        Self {
            reported: ReportedSet::Counted(limits.clone()),
            locks_out: limits.iter().any(|limit| limit.lockout_ms().is_some()),
            limits,
            id,
            share: OnceLock::new(),
        }
    }

    pub(crate) fn new(
        tier: Option<&Arc<str>>,
        policies: &[Policy],
        scope: &Arc<str>,
        generation: u64,
    ) -> Result<Self, BuildError> {
        let tier_name = || tier.map(|t| t.to_string());
        if policies.is_empty() {
            return Err(BuildError::NoPolicies { tier: tier_name() });
        }
        for (i, limit) in policies.iter().enumerate() {
            if policies[..i]
                .iter()
                .any(|other| other.name() == limit.name())
            {
                return Err(BuildError::DuplicatePolicy {
                    tier: tier_name(),
                    name: limit.name().to_owned(),
                });
            }
        }
        let limits: Arc<[Policy]> = policies.iter().map(|limit| limit.scoped(scope)).collect();
        // Within one process only: the cache that reads it is local.
        let id = std::hash::BuildHasher::hash_one(
            &std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default(),
            (generation, &*limits),
        );
        let locks_out = limits.iter().any(|limit| limit.lockout_ms().is_some());
        Ok(Self {
            reported: ReportedSet::store(&limits),
            limits,
            id,
            locks_out,
            share: OnceLock::new(),
        })
    }
}
