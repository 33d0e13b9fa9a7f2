//! The policies a limiter enforces, and the handle that replaces them while it runs.
//!
//! The limits in force are one immutable snapshot behind an atomic pointer: a decision
//! reads the pointer once (no lock), and a swap publishes a whole new snapshot, so no
//! decision ever sees the defaults of one set and the tiers of another. Until its first
//! swap (most limiters never swap) a limiter reads the limits it was built with by a
//! plain reference: loading the pointer takes and gives back a reference, two atomic
//! read-modify-writes, a fifth of an in-process decision.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use arc_swap::ArcSwap;

use crate::limiter::policy_set::PolicySet;
use crate::limiter::telemetry::LimiterMetrics;
use crate::store::build_error::BuildError;
use crate::store::caller::{Caller, OwnQuotas};
use crate::store::policy::Policy;

/// The policies of a limiter: the defaults, and each plan tier's. What
/// [`LimiterBuilder::limits`](crate::LimiterBuilder::limits) starts a limiter with and
/// [`Limiter::set_limits`](crate::Limiter::set_limits) swaps in while it runs.
///
/// ```
/// use tollgate::{Policy, Quota, reload::Limits};
///
/// let limits = Limits::new()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .tier("enterprise", [Policy::sliding_window("per-second", Quota::per_second(120))]);
/// assert_eq!(limits.policies().len(), 1);
/// assert_eq!(limits.tiers().count(), 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    policies: Vec<Policy>,
    tiers: Vec<(Arc<str>, Vec<Policy>)>,
    levels: Vec<(Arc<str>, Vec<Policy>)>,
}

impl Limits {
    /// No policy yet: add at least one with [`policy`](Self::policy).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a policy for callers without a tier. A request is admitted only if every
    /// policy admits it.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Gives callers of plan tier `tier` (see [`Caller::with_tier`]) their own policies
    /// instead of the default ones. Callers naming an unknown tier get the defaults. Naming
    /// a tier again replaces its policies.
    pub fn tier(
        mut self,
        tier: impl Into<Arc<str>>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        let tier = tier.into();
        let policies = policies.into_iter().collect();
        match self.tiers.iter_mut().find(|(name, _)| *name == tier) {
            Some((_, existing)) => *existing = policies,
            None => self.tiers.push((tier, policies)),
        }
        self
    }

    /// Gives the budgets at `level` (a team, an organisation) their policies: a caller that
    /// is a member of such a budget ([`Caller::within`]) is decided against its own
    /// policies and every level's at once, all or nothing. The level's policies are named
    /// `<level>:<name>` in the fields. Naming a level again replaces its policies.
    pub fn level(
        mut self,
        level: impl Into<Arc<str>>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        let level = level.into();
        let policies = policies.into_iter().collect();
        match self.levels.iter_mut().find(|(name, _)| *name == level) {
            Some((_, existing)) => *existing = policies,
            None => self.levels.push((level, policies)),
        }
        self
    }

    /// Each budget level with its policies, in the order they were added.
    pub fn levels(&self) -> impl Iterator<Item = (&str, &[Policy])> {
        self.levels
            .iter()
            .map(|(level, policies)| (&**level, policies.as_slice()))
    }

    /// The policies of callers without a tier, in order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// Each tier with its policies, in the order they were added.
    pub fn tiers(&self) -> impl Iterator<Item = (&str, &[Policy])> {
        self.tiers
            .iter()
            .map(|(tier, policies)| (&**tier, policies.as_slice()))
    }

    /// Refuses what [`LimiterBuilder::try_build`](crate::LimiterBuilder::try_build) would.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn check(&self) -> Result<(), BuildError> {
        ActiveLimits::new(self.clone(), &Arc::from(""), 0).map(drop)
    }

    /// Every policy name, defaults first (repeated when several sets share one).
    pub(crate) fn policy_names(&self) -> impl Iterator<Item = Arc<str>> + '_ {
        self.policies
            .iter()
            .chain(self.tiers.iter().flat_map(|(_, policies)| policies.iter()))
            .map(|policy| policy.name_arc().clone())
            .chain(self.levels.iter().flat_map(|(level, policies)| {
                policies
                    .iter()
                    .map(move |policy| policy.for_level(level).name_arc().clone())
            }))
    }
}

/// The limits in force, checked and scoped: what a decision reads.
#[derive(Debug)]
pub(crate) struct ActiveLimits {
    default: PolicySet,
    tiers: HashMap<Arc<str>, PolicySet>,
    /// The sets of callers with quotas of their own, by the set they change and those
    /// quotas: made once per distinct plan, not per request.
    own_quotas: RwLock<HashMap<(u64, OwnQuotas), PolicySet>>,
    /// Each budget level's policies, named for the level and scoped.
    levels: HashMap<Arc<str>, Arc<[Policy]>>,
    /// As given, for [`Limiter::limits`](crate::Limiter::limits).
    pub(super) source: Limits,
}

/// How many sets of callers' own quotas are kept: distinct plans, not callers. Past it, a
/// caller's set is made for each of its requests.
const MAX_OWN_QUOTA_SETS: usize = 4_096;

impl ActiveLimits {
    /// Checks `limits` as [`LimiterBuilder::try_build`](crate::LimiterBuilder::try_build)
    /// does and scopes their counters. `generation` tells apart the sets of successive
    /// swaps (see [`PolicySet::new`]).
    pub(crate) fn new(
        limits: Limits,
        scope: &Arc<str>,
        generation: u64,
    ) -> Result<Self, BuildError> {
        let default = PolicySet::new(None, &limits.policies, scope, generation)?;
        let mut tiers = HashMap::with_capacity(limits.tiers.len());
        for (tier, policies) in &limits.tiers {
            tiers.insert(
                tier.clone(),
                PolicySet::new(Some(tier), policies, scope, generation)?,
            );
        }
        let mut levels = HashMap::with_capacity(limits.levels.len());
        for (level, policies) in &limits.levels {
            let named: Vec<Policy> = policies.iter().map(|p| p.for_level(level)).collect();
            // Checked as any set is: names valid, none twice, at least one policy.
            let set = PolicySet::new(None, &named, scope, generation)?;
            levels.insert(level.clone(), set.limits);
        }
        Ok(Self {
            default,
            tiers,
            own_quotas: RwLock::default(),
            levels,
            source: limits,
        })
    }

    /// The set `caller` is decided against: its tier's, or the defaults, with the
    /// caller's own quotas when it has some.
    // Inlined, the usual caller (no tier, no quotas of its own) costs two tests; a call
    // cost every decision as much again in its prologue and epilogue.
    #[inline]
    pub(crate) fn for_caller(&self, caller: &Caller) -> Cow<'_, PolicySet> {
        if caller.tier().is_none() && caller.own_quotas().is_none() {
            return Cow::Borrowed(&self.default);
        }
        self.for_planned(caller)
    }

    /// [`for_caller`](Self::for_caller) for a caller with a tier or quotas of its own.
    #[inline(never)]
    fn for_planned(&self, caller: &Caller) -> Cow<'_, PolicySet> {
        let set = caller
            .tier()
            .and_then(|tier| self.tiers.get(tier))
            .unwrap_or(&self.default);
        match caller.own_quotas() {
            None => Cow::Borrowed(set),
            Some(quotas) => Cow::Owned(self.with_own_quotas(set, quotas)),
        }
    }

    /// The set a member of nested budgets is decided against: `set` (its own policies),
    /// counted for it, and the policies of each of its levels, counted for that level's
    /// budget; all under the outermost level's key. Made per request: members are many.
    pub(crate) fn nested(&self, caller: &Caller, set: &PolicySet) -> PolicySet {
        let own = caller.key().encoded();
        let mut limits: Vec<Policy> = set.limits.iter().map(|p| p.of_member("", own)).collect();
        for (level, key) in caller.levels() {
            if let Some(policies) = self.levels.get(level) {
                limits.extend(policies.iter().map(|p| p.of_member(level, key.encoded())));
            }
        }
        PolicySet::nested(set, limits.into())
    }

    /// `set` with `quotas`, made once per distinct plan.
    fn with_own_quotas(&self, set: &PolicySet, quotas: &OwnQuotas) -> PolicySet {
        let key = (set.id, quotas.clone());
        // Updates are single inserts: a poisoned map is still whole.
        if let Some(found) = self
            .own_quotas
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&key)
        {
            return found.clone();
        }
        let made = set.with_quotas(quotas);
        let mut kept = self
            .own_quotas
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if kept.len() < MAX_OWN_QUOTA_SETS {
            kept.entry(key).or_insert_with(|| made.clone());
        }
        made
    }

    pub(crate) fn default_set(&self) -> &PolicySet {
        &self.default
    }
}

/// The limits of one running limiter, what a swap checks them under and registers for
/// them: the snapshot in force, the count of swaps so far, the counters' scope, and the
/// limiter's name and metrics.
pub(crate) struct InForce {
    /// The limits the limiter was built with: in force until `swapped`.
    built_with: Arc<ActiveLimits>,
    /// Set, for good, once a swap has stored a snapshot in `active`.
    swapped: AtomicBool,
    active: ArcSwap<ActiveLimits>,
    generation: AtomicU64,
    scope: Arc<str>,
    name: Arc<str>,
    metrics: Arc<LimiterMetrics>,
}

impl InForce {
    pub(crate) fn new(
        active: ActiveLimits,
        scope: Arc<str>,
        name: Arc<str>,
        metrics: Arc<LimiterMetrics>,
    ) -> Self {
        let built_with = Arc::new(active);
        Self {
            active: ArcSwap::new(built_with.clone()),
            built_with,
            swapped: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            scope,
            name,
            metrics,
        }
    }

    /// The snapshot in force. Hold it only for the part of a decision that reads it.
    pub(crate) fn load(&self) -> Snapshot<'_> {
        if self.swapped.load(Ordering::Acquire) {
            Snapshot::Swapped(self.active.load())
        } else {
            Snapshot::BuiltWith(&self.built_with)
        }
    }

    /// Checks `limits` and swaps them in, or says why they cannot work.
    pub(super) fn replace(&self, limits: Limits) -> Result<(), BuildError> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let active = ActiveLimits::new(limits, &self.scope, generation)?;
        // Counters first, so that a refusal by a newly named policy is counted.
        self.metrics.register_policies(active.source.policy_names());
        self.active.store(Arc::new(active));
        self.swapped.store(true, Ordering::Release);
        // Swapping limits is what the caller asked for (a plan reload, say): worth a line
        // in the log, not an operator's attention.
        tracing::info!(layer = %self.name, "rate limits replaced");
        Ok(())
    }
}

/// The limits in force, as a decision reads them.
pub(crate) enum Snapshot<'a> {
    BuiltWith(&'a ActiveLimits),
    Swapped(arc_swap::Guard<Arc<ActiveLimits>>),
}

impl Deref for Snapshot<'_> {
    type Target = ActiveLimits;

    fn deref(&self) -> &ActiveLimits {
        match self {
            Snapshot::BuiltWith(active) => active,
            Snapshot::Swapped(active) => active,
        }
    }
}

impl fmt::Debug for InForce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self.active.load(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::policy::Quota;
    use crate::{Caller, Limiter};

    fn per_minute(limit: u64) -> Policy {
        Policy::sliding_window("per-minute", Quota::per_minute(limit))
    }

    async fn admitted(limiter: &Limiter, caller: &Caller, requests: usize) -> usize {
        let mut admitted = 0;
        for _ in 0..requests {
            admitted += usize::from(limiter.check(caller).await.is_allowed());
        }
        admitted
    }

    #[tokio::test]
    async fn tiers_are_swapped_with_the_defaults() {
        let limiter = Limiter::builder()
            .limits(
                Limits::new()
                    .policy(per_minute(1))
                    .tier("gold", [per_minute(3)]),
            )
            .build();
        let gold = Caller::new("acme").with_tier("gold");
        assert_eq!(admitted(&limiter, &gold, 5).await, 3);
        // Gold now gets 5 of the same counter; silver is new and counts from zero.
        limiter
            .set_limits(
                Limits::new()
                    .policy(per_minute(1))
                    .tier("gold", [per_minute(5)])
                    .tier(
                        "silver",
                        [Policy::sliding_window("per-hour", Quota::per_hour(2))],
                    ),
            )
            .unwrap();
        assert_eq!(admitted(&limiter, &gold, 5).await, 2);
        let silver = Caller::new("acme").with_tier("silver");
        assert_eq!(admitted(&limiter, &silver, 5).await, 2);
        // A tier dropped from the limits falls back to the defaults, whose count acme
        // shares with every set that has this policy.
        limiter
            .set_limits(Limits::new().policy(per_minute(10)))
            .unwrap();
        assert_eq!(admitted(&limiter, &gold, 10).await, 5);
    }

    #[test]
    fn a_refused_set_leaves_the_limits_in_force() {
        let limiter = Limiter::builder().policy(per_minute(1)).build();
        let before = limiter.limits();
        let duplicate = Limits::new().policy(per_minute(1)).policy(per_minute(2));
        assert_eq!(
            limiter.set_limits(duplicate),
            Err(BuildError::DuplicatePolicy {
                tier: None,
                name: "per-minute".into()
            })
        );
        let empty_tier = Limits::new().policy(per_minute(1)).tier("gold", []);
        assert_eq!(
            limiter.set_limits(empty_tier),
            Err(BuildError::NoPolicies {
                tier: Some("gold".into())
            })
        );
        assert_eq!(limiter.limits(), before);
        assert_eq!(limiter.policies()[0].quota(), 1);
    }

    #[test]
    fn every_swap_gives_the_sets_new_identities() {
        // The denial cache keys refusals on the set's id: a refusal made under swapped-out
        // limits must not be found under the new ones, even if they are equal.
        let scope: Arc<str> = "orders".into();
        let limits = Limits::new()
            .policy(per_minute(1))
            .tier("gold", [per_minute(1)]);
        let first = ActiveLimits::new(limits.clone(), &scope, 0).unwrap();
        let second = ActiveLimits::new(limits, &scope, 1).unwrap();
        let gold = Caller::new("acme").with_tier("gold");
        let plain = Caller::new("acme");
        assert_ne!(first.for_caller(&plain).id, second.for_caller(&plain).id);
        assert_ne!(first.for_caller(&gold).id, second.for_caller(&gold).id);
        // Within one generation equal sets share an id: they count the same, so a refusal
        // by one holds for the other.
        assert_eq!(first.for_caller(&plain).id, first.for_caller(&gold).id);
        assert_eq!(
            first.for_caller(&plain).limits[0].counter(),
            second.for_caller(&plain).limits[0].counter()
        );
    }

    #[test]
    fn a_tier_named_twice_keeps_the_last_policies() {
        let limits = Limits::new()
            .tier("gold", [per_minute(1)])
            .tier("gold", [per_minute(2)]);
        assert_eq!(limits.tiers().count(), 1);
        assert_eq!(limits.tiers().next().unwrap().1, [per_minute(2)]);
    }
}
