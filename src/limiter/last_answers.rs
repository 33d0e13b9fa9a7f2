//! What the store last answered for each recently seen caller: where a local share starts
//! when the store goes away, instead of from nothing.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use crate::limiter::bounded_map::{BoundedMap, WhenFull};
use crate::limiter::policy_set::PolicySet;
use crate::store::backend::CheckOutcome;
use crate::store::caller::CallerKey;
use crate::store::evaluate::INLINE_POLICIES;

const SHARDS: usize = 16;

/// How much of each policy a caller had used when the store last answered for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LastAnswer {
    /// When the store was asked, on the limiter's clock.
    pub(crate) at_ms: u64,
    set_id: u64,
    /// Until when the answer still says anything: the longest retention of its policies.
    until_ms: u64,
    used: [u64; INLINE_POLICIES],
}

impl LastAnswer {
    /// The units of the `i`th policy's quota the caller had used; `None` for a policy
    /// beyond the first few, which starts as for a caller never seen.
    pub(crate) fn used(&self, i: usize) -> Option<u64> {
        self.used.get(i).copied()
    }
}

/// A bounded map from a caller to the store's last answer for it. When a shard is full,
/// answers that no longer say anything make room; if none of the few it looks at has, the
/// new answer is not kept (the caller's share then starts as for a caller never seen), so
/// a flood of new callers neither pushes out the callers already kept nor slows anyone.
pub(crate) struct LastAnswers {
    shards: Box<[Mutex<BoundedMap<LastAnswer>>]>,
    hasher: RandomState,
    shard_capacity: usize,
}

impl LastAnswers {
    pub(crate) fn new(capacity: usize) -> Self {
        let shard_capacity = capacity.div_ceil(SHARDS).max(1);
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(BoundedMap::new(shard_capacity, WhenFull::KeepOld)))
                .collect(),
            hasher: RandomState::new(),
            shard_capacity,
        }
    }

    /// Keeps what the store answered for `caller` against `set`, asked at `at_ms`.
    pub(crate) fn record(
        &self,
        caller: &CallerKey,
        set: &PolicySet,
        outcome: &CheckOutcome,
        at_ms: u64,
    ) {
        let mut used = [0; INLINE_POLICIES];
        for ((used, policy), outcome) in
            used.iter_mut().zip(set.limits.iter()).zip(outcome.limits())
        {
            *used = policy.algorithm().quota().saturating_sub(outcome.remaining);
        }
        let retention = set
            .limits
            .iter()
            .map(|p| p.retention_ms())
            .max()
            .unwrap_or(0);
        let answer = LastAnswer {
            at_ms,
            set_id: set.id,
            until_ms: at_ms.saturating_add(retention),
            used,
        };
        let mut shard = self.shard(caller);
        if let Some((kept, until_ms)) = shard.get_mut(caller) {
            // Answers can arrive out of order: the later question tells more.
            if kept.at_ms <= at_ms {
                *kept = answer;
                *until_ms = answer.until_ms;
            }
            return;
        }
        shard.insert(caller, answer, answer.until_ms, at_ms);
    }

    /// The store's last answer for `caller` against the set `set_id`, if it still says
    /// anything at `now_ms`.
    pub(crate) fn get(&self, caller: &CallerKey, set_id: u64, now_ms: u64) -> Option<LastAnswer> {
        let shard = self.shard(caller);
        let answer = shard.get(caller)?;
        (answer.set_id == set_id && answer.until_ms > now_ms).then_some(*answer)
    }

    fn shard(&self, caller: &CallerKey) -> MutexGuard<'_, BoundedMap<LastAnswer>> {
        let index = (self.hasher.hash_one(caller) as usize) % self.shards.len();
        // Updates are single inserts: a poisoned shard is still consistent.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for LastAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LastAnswers")
            .field("capacity", &(self.shard_capacity * self.shards.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::store::algorithm::{Algorithm, PolicyOutcome};
    use crate::store::policy::Policy;

    fn per_second(limit: u64) -> PolicySet {
        let policy = Policy::new(
            "per-second",
            Algorithm::sliding_window(limit, Duration::from_secs(1)),
        );
        PolicySet::new(None, &[policy], &Arc::from("test"), 0).expect("a set")
    }

    fn left(remaining: u64) -> CheckOutcome {
        CheckOutcome::new(vec![PolicyOutcome {
            admitted: remaining > 0,
            remaining,
            reset_ms: 0,
        }])
    }

    #[test]
    fn an_answer_says_what_was_used_for_its_set_while_it_weighs() {
        let answers = LastAnswers::new(100);
        let set = per_second(50);
        let acme = CallerKey::new("acme");
        answers.record(&acme, &set, &left(8), 1_000);
        let answer = answers.get(&acme, set.id, 1_500).expect("kept");
        assert_eq!((answer.at_ms, answer.used(0)), (1_000, Some(42)));
        // Another set (a tier, new limits) learns nothing from it.
        assert_eq!(answers.get(&acme, set.id + 1, 1_500), None);
        // Two windows on, the sliding window has forgotten it too.
        assert_eq!(answers.get(&acme, set.id, 3_000), None);
        // A late answer to an earlier question does not replace a later one.
        answers.record(&acme, &set, &left(50), 900);
        assert_eq!(
            answers.get(&acme, set.id, 1_500).and_then(|a| a.used(0)),
            Some(42)
        );
    }

    #[test]
    fn a_full_map_makes_room_only_from_answers_that_no_longer_weigh() {
        let answers = LastAnswers::new(1);
        let set = per_second(50);
        let callers: Vec<CallerKey> = (0..200).map(|i| CallerKey::new(format!("c{i}"))).collect();
        for caller in &callers {
            answers.record(caller, &set, &left(0), 1_000);
        }
        let kept = callers
            .iter()
            .filter(|c| answers.get(c, set.id, 1_000).is_some())
            .count();
        assert!(kept <= SHARDS, "{kept} kept in {SHARDS} shards of one");
        // Once they no longer weigh, new answers take their places.
        for caller in &callers {
            answers.record(caller, &set, &left(0), 5_000);
        }
        let kept = callers
            .iter()
            .filter(|c| answers.get(c, set.id, 5_000).is_some())
            .count();
        assert!(kept > 0 && kept <= SHARDS);
    }
}
