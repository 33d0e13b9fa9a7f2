//! Each caller's local rate and the lease it holds, per policy set.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::store::algorithm::PolicyOutcome;
use crate::store::caller::CallerKey;
use crate::store::policy::Policy;

const SHARDS: usize = 16;
/// The span of one bucket of the local rate estimate.
const RATE_BUCKET_MS: u64 = 1_000;
/// How often a shard forgets idle callers and collects expired leases.
const SWEEP_INTERVAL_MS: u64 = 1_000;

/// Units held by this instance, taken from the store at once.
#[derive(Clone, Debug)]
pub(crate) struct Lease {
    /// Units not spent yet.
    pub(crate) left: u64,
    /// On the local clock; the lease is spent only before it.
    pub(crate) expires_at_ms: u64,
    /// When the store counted the units, on its clock (a refund names it).
    pub(crate) counted_at_ms: u64,
    /// What the store had left per policy after the grant.
    pub(crate) shared: Vec<PolicyOutcome>,
    /// The policies the units were counted under, which a give-back names.
    pub(crate) limits: Arc<[Policy]>,
}

/// Units of an ended lease to give back to the store: to the caller that took it, under
/// the policies it was counted under (a sweep ends other callers' leases too, and a swap of
/// limits may have orphaned it).
#[derive(Clone, Debug)]
pub(crate) struct Unused {
    pub(crate) caller: CallerKey,
    pub(crate) limits: Arc<[Policy]>,
    pub(crate) units: u64,
    pub(crate) counted_at_ms: u64,
}

/// What a request of a caller does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Admitted from the lease, which holds `left` units after it.
    Served {
        left: u64,
        counted_at_ms: u64,
        shared: Vec<PolicyOutcome>,
    },
    /// Take a lease of `units` (the request's cost included); the table waits for
    /// [`LeaseTable::granted`] or [`LeaseTable::failed`].
    Take { units: u64 },
    /// Ask the store about this request alone.
    Ask,
}

/// A step, and what ended leases left to give back.
#[derive(Debug)]
pub(crate) struct Next {
    pub(crate) step: Step,
    pub(crate) unused: Vec<Unused>,
    /// Leases that ended by running out of time (with units left) or to the last unit.
    pub(crate) expired: u64,
    pub(crate) spent: u64,
}

struct Entry {
    /// Units asked for in the current and the previous rate bucket.
    bucket_start_ms: u64,
    current: u64,
    previous: u64,
    lease: Option<Lease>,
    /// A lease is being taken: other requests ask the store meanwhile.
    taking: bool,
    last_seen_ms: u64,
}

impl Entry {
    fn count(&mut self, now_ms: u64, units: u64) {
        let start = now_ms - now_ms % RATE_BUCKET_MS;
        if start != self.bucket_start_ms {
            self.previous = if start == self.bucket_start_ms + RATE_BUCKET_MS {
                self.current
            } else {
                0
            };
            self.current = 0;
            self.bucket_start_ms = start;
        }
        self.current = self.current.saturating_add(units);
        self.last_seen_ms = now_ms;
    }

    /// Units per second over the last bucket's span, the previous bucket weighed by the
    /// part of it still inside the span.
    fn rate_per_sec(&self, now_ms: u64) -> u64 {
        let elapsed = now_ms
            .saturating_sub(self.bucket_start_ms)
            .min(RATE_BUCKET_MS);
        let previous = u128::from(self.previous) * u128::from(RATE_BUCKET_MS - elapsed)
            / u128::from(RATE_BUCKET_MS);
        let units = u64::try_from(previous)
            .unwrap_or(u64::MAX)
            .saturating_add(self.current);
        units.saturating_mul(1_000) / RATE_BUCKET_MS
    }
}

#[derive(Default)]
struct Shard {
    entries: HashMap<(CallerKey, u64), Entry>,
    last_sweep_ms: u64,
}

/// Callers' rates and leases, sharded by caller.
pub(crate) struct LeaseTable {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    shard_capacity: usize,
}

/// How a caller is leased: from which rate, for how long, and how many units at most.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizing {
    pub(crate) threshold_per_sec: u64,
    pub(crate) period_ms: u64,
    /// The most one lease may hold: the smallest quota divided by the instance count.
    pub(crate) cap: u64,
}

impl LeaseTable {
    pub(crate) fn new(max_callers: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            shard_capacity: max_callers.div_ceil(SHARDS),
        }
    }

    /// Which shard holds `caller`.
    pub(crate) fn shard_index(&self, caller: &CallerKey) -> usize {
        (self.hasher.hash_one(caller) as usize) % self.shards.len()
    }

    fn shard(&self, caller: &CallerKey) -> MutexGuard<'_, Shard> {
        self.shards[self.shard_index(caller)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a request of `cost` units of `caller` (under policy set `set_id`) at
    /// `now_ms` and says how to decide it.
    pub(crate) fn next(
        &self,
        caller: &CallerKey,
        set_id: u64,
        cost: u64,
        now_ms: u64,
        sizing: Sizing,
    ) -> Next {
        let mut next = Next {
            step: Step::Ask,
            unused: Vec::new(),
            expired: 0,
            spent: 0,
        };
        let mut shard = self.shard(caller);
        if now_ms.saturating_sub(shard.last_sweep_ms) >= SWEEP_INTERVAL_MS {
            shard.last_sweep_ms = now_ms;
            shard.entries.retain(|(owner, _), entry| {
                if let Some(lease) = &entry.lease
                    && now_ms >= lease.expires_at_ms
                {
                    end(owner, entry.lease.take(), &mut next);
                }
                entry.lease.is_some()
                    || entry.taking
                    || now_ms.saturating_sub(entry.last_seen_ms) < 2 * RATE_BUCKET_MS
            });
        }
        let key = (caller.clone(), set_id);
        if !shard.entries.contains_key(&key) && shard.entries.len() >= self.shard_capacity {
            return next;
        }
        let entry = shard.entries.entry(key).or_insert_with(|| Entry {
            bucket_start_ms: now_ms - now_ms % RATE_BUCKET_MS,
            current: 0,
            previous: 0,
            lease: None,
            taking: false,
            last_seen_ms: now_ms,
        });
        entry.count(now_ms, cost);
        if let Some(lease) = &mut entry.lease {
            if now_ms < lease.expires_at_ms && lease.left >= cost {
                lease.left -= cost;
                next.step = Step::Served {
                    left: lease.left,
                    counted_at_ms: lease.counted_at_ms,
                    shared: lease.shared.clone(),
                };
                if lease.left == 0 {
                    next.spent += 1;
                    entry.lease = None;
                }
                return next;
            }
            // Expired, or too small for this request: what is left goes back.
            end(caller, entry.lease.take(), &mut next);
        }
        if entry.taking || entry.rate_per_sec(now_ms) < sizing.threshold_per_sec {
            return next;
        }
        let wanted = entry
            .rate_per_sec(now_ms)
            .saturating_mul(sizing.period_ms)
            .div_ceil(1_000);
        let units = wanted.min(sizing.cap).max(cost);
        if units > sizing.cap {
            return next;
        }
        entry.taking = true;
        next.step = Step::Take { units };
        next
    }

    /// Whether `caller` holds a lease under the set `set_id` that has not expired by the
    /// last request's time, or is taking one.
    pub(crate) fn holds(&self, caller: &CallerKey, set_id: u64) -> bool {
        let shard = self.shard(caller);
        shard
            .entries
            .get(&(caller.clone(), set_id))
            .is_some_and(|entry| {
                entry.taking
                    || entry
                        .lease
                        .as_ref()
                        .is_some_and(|lease| lease.expires_at_ms > entry.last_seen_ms)
            })
    }

    /// The lease asked for was granted; a lease of 0 units is none.
    pub(crate) fn granted(&self, caller: &CallerKey, set_id: u64, lease: Option<Lease>) {
        let mut shard = self.shard(caller);
        if let Some(entry) = shard.entries.get_mut(&(caller.clone(), set_id)) {
            entry.taking = false;
            entry.lease = lease.filter(|lease| lease.left > 0);
        }
    }
}

/// Ends `owner`'s `lease`: units left go back to it.
fn end(owner: &CallerKey, lease: Option<Lease>, next: &mut Next) {
    let Some(lease) = lease else { return };
    if lease.left > 0 {
        next.expired += 1;
        next.unused.push(Unused {
            caller: owner.clone(),
            limits: lease.limits,
            units: lease.left,
            counted_at_ms: lease.counted_at_ms,
        });
    } else {
        next.spent += 1;
    }
}

impl std::fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTable")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZING: Sizing = Sizing {
        threshold_per_sec: 10,
        period_ms: 100,
        cap: 25,
    };

    fn lease(left: u64, expires_at_ms: u64) -> Lease {
        Lease {
            left,
            expires_at_ms,
            counted_at_ms: 7,
            shared: Vec::new(),
            limits: Arc::new([]),
        }
    }

    #[test]
    fn a_caller_under_the_threshold_asks_the_store() {
        let table = LeaseTable::new(100);
        let acme = CallerKey::new("acme");
        for t in 0..9 {
            assert!(matches!(table.next(&acme, 1, 1, t, SIZING).step, Step::Ask));
        }
        // The tenth unit within a second reaches 10/s: a lease of 1 s x 10/s x 100 ms.
        assert!(matches!(
            table.next(&acme, 1, 1, 9, SIZING).step,
            Step::Take { units: 1 }
        ));
        // While it is being taken, others ask the store.
        assert!(matches!(
            table.next(&acme, 1, 1, 10, SIZING).step,
            Step::Ask
        ));
    }

    #[test]
    fn a_lease_is_spent_then_ends_and_gives_back_what_is_left() {
        let table = LeaseTable::new(100);
        let acme = CallerKey::new("acme");
        for t in 0..300 {
            let _ = table.next(&acme, 1, 1, t, SIZING);
        }
        table.granted(&acme, 1, Some(lease(3, 400)));
        let served = table.next(&acme, 1, 2, 300, SIZING);
        assert!(matches!(served.step, Step::Served { left: 1, .. }));
        // Too small for a cost of 2: it ends, its unit goes back, a new one is asked for
        // (capped at a quarter of the quota).
        let next = table.next(&acme, 1, 2, 301, SIZING);
        let unused: Vec<_> = next
            .unused
            .iter()
            .map(|u| (&u.caller, u.units, u.counted_at_ms))
            .collect();
        assert_eq!(unused, [(&acme, 1, 7)]);
        assert!(matches!(next.step, Step::Take { units: 25 }));
        table.granted(&acme, 1, Some(lease(5, 350)));
        let expired = table.next(&acme, 1, 1, 350, SIZING);
        assert_eq!(expired.expired, 1);
        assert_eq!(expired.unused[0].units, 5);
    }

    #[test]
    fn a_sweep_gives_each_ended_lease_back_to_its_own_caller() {
        let table = LeaseTable::new(100);
        let a = CallerKey::new("a");
        let b = (0..)
            .map(|i| CallerKey::new(format!("b{i}")))
            .find(|b| table.shard_index(b) == table.shard_index(&a))
            .unwrap();
        for t in 0..300 {
            let _ = table.next(&a, 1, 1, t, SIZING);
        }
        table.granted(&a, 1, Some(lease(5, 400)));
        // A second on, b's request sweeps the shard and ends a's expired lease: its units
        // go back to a.
        let swept = table.next(&b, 2, 1, 1_300, SIZING);
        let unused: Vec<_> = swept.unused.iter().map(|u| (&u.caller, u.units)).collect();
        assert_eq!(unused, [(&a, 5)]);
    }

    #[test]
    fn a_cost_above_the_cap_is_never_leased() {
        let table = LeaseTable::new(100);
        let acme = CallerKey::new("acme");
        for t in 0..100 {
            assert!(matches!(
                table.next(&acme, 1, 30, t, SIZING).step,
                Step::Ask
            ));
        }
    }

    #[test]
    fn the_table_is_bounded() {
        let table = LeaseTable::new(SHARDS);
        for i in 0..1_000 {
            let _ = table.next(&CallerKey::new(format!("c{i}")), 1, 1, 0, SIZING);
        }
        let tracked: usize = table
            .shards
            .iter()
            .map(|s| s.lock().unwrap().entries.len())
            .sum();
        assert!(tracked <= SHARDS);
    }
}
