//! Callers known to be over a limit, refused locally until their retry time.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::limiter::decision::RateLimitInfo;
use crate::store::caller::CallerKey;

const SHARDS: usize = 16;

/// A bounded map from a caller and the policy set that refused it to that refusal, kept
/// until the exact time the store would admit the caller again. Keying on the set keeps a
/// refusal from following a caller into another tier. Requests for such a caller are refused without a
/// store call, and while the store is down the cached refusals keep refusing (fail static).
///
/// A refusal of a request of `c` units says that fewer than `c` remain, and how long until
/// `c` fit: in front of the store it is served to requests of exactly `c` units, whose wait
/// it knows, and the store is asked about other costs (a cheaper one may fit, a dearer one
/// waits longer). While the store cannot be asked, it refuses every cost of `c` or more
/// ([`covering`](Self::covering)). A refund removes the caller's refusal, since the store
/// may admit again at once.
pub(crate) struct DenialCache {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    shard_capacity: usize,
    /// Refusals held across the shards, kept under each shard's lock: most requests meet
    /// an empty cache (callers under their limits), and then a lookup costs one load
    /// instead of a hash and a lock.
    entries: AtomicUsize,
}

#[derive(Default)]
struct Shard {
    denials: HashMap<(CallerKey, u64), Denial>,
    // When the shard was last cleared of expired refusals: at most once per
    // SWEEP_INTERVAL_MS, so a full cache does not rescan itself on every refusal.
    last_sweep_ms: u64,
}

const SWEEP_INTERVAL_MS: u64 = 1_000;

#[derive(Clone)]
struct Denial {
    until_ms: u64,
    info: RateLimitInfo,
}

impl DenialCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            shard_capacity: capacity.div_ceil(SHARDS).max(1),
            entries: AtomicUsize::new(0),
        }
    }

    /// Whether no refusal is cached: then there is nothing to look up, and no need to read
    /// the clock for it.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.load(Ordering::Acquire) == 0
    }

    /// The cached refusal of `caller` by the policy set `set` of a request of exactly
    /// `cost` units, with its waiting times brought to `now_ms`: the wait the store gave
    /// that cost, which another cost's may not be.
    pub(crate) fn get(
        &self,
        caller: &CallerKey,
        set: u64,
        now_ms: u64,
        cost: u64,
    ) -> Option<RateLimitInfo> {
        self.find(caller, set, now_ms, |cached| cached == cost, cost)
    }

    /// The cached refusal of `caller` by the policy set `set` that still refuses a request
    /// of `cost` units (one of that cost or less), while the store cannot be asked: the
    /// wait it advertises is the refused cost's, at most that of `cost`.
    pub(crate) fn covering(
        &self,
        caller: &CallerKey,
        set: u64,
        now_ms: u64,
        cost: u64,
    ) -> Option<RateLimitInfo> {
        self.find(caller, set, now_ms, |cached| cached <= cost, cost)
    }

    /// The cached refusal `serves` accepts (given the cost it was made for), as the
    /// refusal of a request of `cost` units: built once, where it is served.
    fn find(
        &self,
        caller: &CallerKey,
        set: u64,
        now_ms: u64,
        serves: impl FnOnce(u64) -> bool,
        cost: u64,
    ) -> Option<RateLimitInfo> {
        if self.entries.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut shard = self.shard(caller);
        let key = (caller.clone(), set);
        let denial = shard.denials.get(&key)?;
        if denial.until_ms <= now_ms {
            shard.denials.remove(&key);
            self.entries.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        if !serves(denial.info.cost()) {
            return None;
        }
        Some(denial.info.waiting(denial.until_ms - now_ms, cost))
    }

    /// Forgets the refusal of `caller` by the policy set `set`: units were given back.
    pub(crate) fn remove(&self, caller: &CallerKey, set: u64) {
        if self.entries.load(Ordering::Acquire) == 0 {
            return;
        }
        if self
            .shard(caller)
            .denials
            .remove(&(caller.clone(), set))
            .is_some()
        {
            self.entries.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Remembers a refusal (of a request of `info.cost()` units) until `now_ms + retry_ms`. When full, expired entries are
    /// dropped; if none has expired the refusal is simply not cached (the cache only saves
    /// store calls, so skipping it is always safe).
    pub(crate) fn insert(
        &self,
        caller: &CallerKey,
        set: u64,
        info: &RateLimitInfo,
        now_ms: u64,
        retry_ms: u64,
    ) {
        if retry_ms == 0 {
            return;
        }
        let mut shard = self.shard(caller);
        let key = (caller.clone(), set);
        if shard.denials.len() >= self.shard_capacity && !shard.denials.contains_key(&key) {
            if now_ms.saturating_sub(shard.last_sweep_ms) < SWEEP_INTERVAL_MS {
                return;
            }
            let before = shard.denials.len();
            shard.denials.retain(|_, denial| denial.until_ms > now_ms);
            self.entries
                .fetch_sub(before - shard.denials.len(), Ordering::AcqRel);
            shard.last_sweep_ms = now_ms;
            if shard.denials.len() >= self.shard_capacity {
                return;
            }
        }
        let denial = Denial {
            until_ms: now_ms.saturating_add(retry_ms),
            info: info.clone(),
        };
        if shard.denials.insert(key, denial).is_none() {
            self.entries.fetch_add(1, Ordering::AcqRel);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map(|m| m.denials.len()).unwrap_or(0))
            .sum()
    }

    fn shard(&self, caller: &CallerKey) -> MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(caller) as usize) % self.shards.len();
        // Updates are single inserts and removals: a poisoned shard is still consistent.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for DenialCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenialCache")
            .field("capacity", &(self.shard_capacity * self.shards.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::algorithm::{Algorithm, PolicyOutcome};
    use crate::store::policy::Policy;
    use std::sync::Arc;
    use std::time::Duration;

    fn refusal() -> RateLimitInfo {
        let limits: Arc<[Policy]> = Arc::new([Policy::new(
            "per-second",
            Algorithm::sliding_window(5, Duration::from_secs(1)),
        )]);
        let outcomes = [PolicyOutcome {
            admitted: false,
            remaining: 0,
            reset_ms: 700,
        }];
        RateLimitInfo::from_outcomes(
            &limits,
            &outcomes,
            crate::limiter::decision::DecisionSource::Store,
        )
    }

    #[test]
    fn a_refusal_is_served_until_its_retry_time() {
        let cache = DenialCache::new(100);
        let acme = CallerKey::new("acme");
        cache.insert(&acme, 1, &refusal(), 1_000, 700);
        // Another policy set (a tier) never sees it.
        assert!(cache.get(&acme, 2, 1_500, 1).is_none());
        let served = cache.get(&acme, 1, 1_500, 1).expect("cached");
        assert_eq!(served.retry_after_ms(), 200);
        assert_eq!(served.retry_after_secs(), 1);
        assert_eq!(cache.entries.load(Ordering::Acquire), 1);
        assert!(cache.get(&acme, 1, 1_700, 1).is_none());
        assert_eq!(cache.len(), 0);
        // The count that lets an empty cache skip the lookup follows the maps.
        assert_eq!(cache.entries.load(Ordering::Acquire), 0);
        cache.insert(&acme, 1, &refusal(), 2_000, 700);
        cache.insert(&acme, 1, &refusal(), 2_100, 700);
        assert_eq!(cache.entries.load(Ordering::Acquire), 1);
    }

    #[test]
    fn a_refusal_is_served_for_its_cost_and_covers_more_while_the_store_is_down() {
        let cache = DenialCache::new(100);
        let acme = CallerKey::new("acme");
        cache.insert(&acme, 1, &refusal().for_cost(10), 1_000, 700);
        // Fewer than 10 units remain: 9 may still fit; 25 do not, but wait longer than 10.
        assert!(cache.get(&acme, 1, 1_100, 9).is_none());
        assert_eq!(cache.get(&acme, 1, 1_100, 10).map(|r| r.cost()), Some(10));
        assert!(cache.get(&acme, 1, 1_100, 25).is_none());
        // Without a store to ask, the refusal still refuses 10 or more.
        assert!(cache.covering(&acme, 1, 1_100, 9).is_none());
        assert_eq!(
            cache.covering(&acme, 1, 1_100, 25).map(|r| r.cost()),
            Some(25)
        );
        cache.remove(&acme, 1);
        assert!(cache.covering(&acme, 1, 1_100, 25).is_none());
    }

    #[test]
    fn the_cache_stays_bounded() {
        let cache = DenialCache::new(64);
        for i in 0..10_000 {
            cache.insert(&CallerKey::new(format!("c{i}")), 1, &refusal(), 0, 10_000);
        }
        assert!(cache.len() <= 64);
        assert_eq!(cache.entries.load(Ordering::Acquire), cache.len());
        // Expired entries make room again.
        cache.insert(&CallerKey::new("late"), 1, &refusal(), 20_000, 500);
        assert!(cache.get(&CallerKey::new("late"), 1, 20_100, 1).is_some());
        assert_eq!(cache.entries.load(Ordering::Acquire), cache.len());
    }
}
