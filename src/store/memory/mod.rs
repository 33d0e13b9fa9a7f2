mod counters;
mod entry;
mod shard;
mod slots;

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use self::counters::Counters;
use self::entry::{Block, Entry, PackedDecision};
use self::shard::{KeyHasher, MAX_SHARD_KEYS, Shard};
use super::backend::{Backend, CheckOutcome, LeaseGrant, Refund, StoreError};
use super::evaluate::{INLINE_POLICIES, decide};
use crate::store::algorithm::{Packing, PolicyOutcome, State};
use crate::store::caller::CallerKey;
use crate::store::clock::{Clock, SystemClock};
use crate::store::future::StoreFuture;
use crate::store::lockout;
use crate::store::policy::Policy;

const DEFAULT_MAX_KEYS: usize = 1_000_000;
const DEFAULT_SHARDS: usize = 64;
const DEFAULT_SWEEP_INTERVAL_MS: u64 = 10_000;

/// Counters in this process: sharded, bounded in memory, idle callers forgotten.
///
/// Each instance of a service keeps its own counts, so with 4 instances behind a load
/// balancer each enforces the full limit on its share of the traffic. Use it for single
/// instances, for tests, for a local bucket in front of a shared one, and as the local
/// share when a shared store is down.
///
/// - **Sharded**: callers are spread over 64 maps by a keyed hash (more when a map would hold
///   over 65,536 of them: see [`shards`](InMemoryBackend::shards)). A decision on a known
///   caller holds its map's read lock and the caller's own lock, so concurrent requests
///   contend only when they name the same caller; adding a caller takes the write lock.
/// - **Bounded**: at most [`max_keys`](InMemoryBackend::max_keys) callers are tracked (default
///   1,000,000). A full shard first forgets idle callers; if none is idle it evicts a
///   caller not seen since the eviction hand last passed (the CLOCK approximation of
///   least-recently-used), who then starts afresh. Callers that keep sending, refused
///   ones included, stay tracked under a flood of one-off keys.
/// - **Idle callers evicted**: a caller whose counters no longer affect any decision is
///   dropped during periodic sweeps (every 10 s, piggybacked on requests; no background
///   task, so it works on any runtime). A caller that keeps coming back may be kept up to
///   a sixteenth of its counters' life longer (its states by then weigh nothing, so it is
///   decided as a new caller would be), so that the time it is kept until is written once
///   in a while rather than by nearly every request.
///
/// Clones share the same counters.
///
/// ```
/// use std::time::Duration;
/// use tollgate::InMemoryBackend;
/// use tollgate::store::ManualClock;
///
/// let backend = InMemoryBackend::new()
///     .max_keys(100_000)
///     .clock(ManualClock::new(0));
/// assert_eq!(backend.tracked_keys(), 0);
/// ```
#[derive(Clone)]
pub struct InMemoryBackend {
    shared: Arc<Shared>,
}

// Laid out in order and aligned to a cache line: what every decision reads (the shards,
// the hasher, the clock and the sweep interval) comes first and shares one line, which a
// busy server's other work evicts between requests.
#[repr(C, align(64))]
struct Shared {
    shards: Box<[RwLock<Shard>]>,
    hasher: KeyHasher,
    /// What the backend was made with: its clock and sweep interval, and what the
    /// setters make it anew from.
    settings: Settings,
    shard_capacity: usize,
    /// The cap on tracked callers: `settings.max_keys` rounded down to whole shards.
    max_keys: usize,
    /// Slots of requests in flight, by limit name and caller: only while held.
    slots: slots::Slots,
}

impl InMemoryBackend {
    /// A backend with the defaults: 1,000,000 callers at most, 64 shards, the system clock,
    /// idle callers swept every 10 s. The methods below change them, each returning a new,
    /// empty backend: configure a backend before its clones go to limiters.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::InMemoryBackend;
    /// use tollgate::store::ManualClock;
    ///
    /// let backend = InMemoryBackend::new()
    ///     .max_keys(100_000)
    ///     .shards(16)
    ///     .sweep_interval(Duration::from_secs(5))
    ///     .clock(ManualClock::new(0));
    /// assert_eq!(backend.key_capacity(), 100_000);
    /// ```
    pub fn new() -> Self {
        Self::from_settings(Settings {
            max_keys: DEFAULT_MAX_KEYS,
            shards: DEFAULT_SHARDS,
            clock: Arc::new(SystemClock),
            sweep_interval_ms: DEFAULT_SWEEP_INTERVAL_MS,
            exact_idle: false,
        })
    }

    /// Caps the number of tracked callers (default 1,000,000; at least 1, rounded down to a
    /// multiple of the shard count).
    pub fn max_keys(self, max_keys: usize) -> Self {
        self.remade(|settings| settings.max_keys = max_keys.max(1))
    }

    /// Spreads callers over this many locks (default 64), or over as many more as it takes
    /// for none to hold over 65,536 callers (a caller's place in its shard is 16 bits, so
    /// the shard's index stays small enough to be found in the cache).
    ///
    /// ```
    /// use tollgate::InMemoryBackend;
    ///
    /// // 200,000 callers take at least 4 shards: all of them are tracked.
    /// let backend = InMemoryBackend::new().max_keys(200_000).shards(1);
    /// assert_eq!(backend.key_capacity(), 200_000);
    /// ```
    pub fn shards(self, shards: usize) -> Self {
        self.remade(|settings| settings.shards = shards.max(1))
    }

    /// Reads time from `clock`, such as a [`ManualClock`](crate::store::ManualClock) in tests.
    pub fn clock(self, clock: impl Clock) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        self.remade(|settings| settings.clock = clock)
    }

    /// How often each shard sweeps out idle callers (default 10 s).
    pub fn sweep_interval(self, interval: Duration) -> Self {
        let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.remade(|settings| settings.sweep_interval_ms = millis)
    }

    /// Forgets each caller as soon as its states affect no decision, not up to a sixteenth
    /// of their retention later: for a local share's counters, which start a caller they
    /// no longer count from the store's last answer, so that a state that has run out
    /// never stands in for that answer.
    pub(crate) fn exact_idle_times(self) -> Self {
        self.remade(|settings| settings.exact_idle = true)
    }

    /// A new, empty backend with this one's settings changed by `change`.
    fn remade(self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.shared.settings.clone();
        change(&mut settings);
        Self::from_settings(settings)
    }

    fn from_settings(settings: Settings) -> Self {
        // No shard holds more than a 16-bit position can name; more shards than keys would
        // leave shards with no room at all.
        let shards = settings
            .shards
            .max(settings.max_keys.div_ceil(MAX_SHARD_KEYS))
            .min(settings.max_keys);
        let shard_capacity = settings.max_keys / shards;
        InMemoryBackend {
            shared: Arc::new(Shared {
                shards: (0..shards).map(|_| RwLock::new(Shard::default())).collect(),
                hasher: KeyHasher::default(),
                shard_capacity,
                max_keys: shard_capacity * shards,
                slots: slots::Slots::default(),
                settings,
            }),
        }
    }

    /// The cap on tracked callers.
    pub fn key_capacity(&self) -> usize {
        self.shared.max_keys
    }

    /// How many callers are tracked now; never above [`key_capacity`](Self::key_capacity).
    pub fn tracked_keys(&self) -> usize {
        self.shared
            .shards
            .iter()
            .map(|s| read(s).entries.len())
            .sum()
    }

    /// The caller's hash, computed once per decision, and its shard.
    #[inline]
    fn shard(&self, caller: &CallerKey) -> (u64, &RwLock<Shard>) {
        let hash = self.shared.hasher.hash_one(caller.encoded());
        // Bits the table uses neither for the slot (the low ones) nor for its tags (the
        // top seven), so callers of one shard still spread over their table.
        // Scaled by a multiply rather than a 64-bit division (tens of cycles on every
        // decision): the 32 bits times the shard count, over 2^32, land in 0..count.
        let bits = (hash >> 24) as u32;
        let shard_index = ((u64::from(bits) * self.shared.shards.len() as u64) >> 32) as usize;
        (hash, &self.shared.shards[shard_index])
    }

    /// Gives `refund` back to `caller`'s counters of `limits`; a caller no longer tracked
    /// has nothing to give back.
    fn give_back(&self, caller: &CallerKey, limits: &[Policy], refund: Refund) {
        let now = self.shared.settings.clock.now_millis();
        let (hash, shard) = self.shard(caller);
        let mut shard = write(shard);
        let Some(position) = shard.find(hash, caller.encoded()) else {
            return;
        };
        if shard.entries[position].is_idle(now) {
            return;
        }
        for limit in limits {
            // A counter the shard never stored holds nothing to give back.
            let Some(counter) = shard.counter(limit.counter_arc()) else {
                continue;
            };
            let block = limit.lockout_arc().and_then(|id| shard.counter(id));
            let entry = &mut shard.entries[position];
            let given_back = limit.algorithm().refund_state(
                entry.state(counter),
                refund.counted_at_ms(),
                refund.cost(),
                now,
            );
            if let Some(state) = given_back {
                entry.store(counter, state);
                // A request counted by the time its caller was blocked, that turns out not
                // to count, was part of what used the quota up: without it the quota was
                // not used up, and the block goes.
                if let Some(block) = block
                    && let Some(standing) = entry.block(block)
                    && standing.until_ms > now
                    && standing.since_ms >= refund.counted_at_ms()
                {
                    entry.store_block(block, Block::default());
                }
            }
        }
    }

    /// Counts `units` more for `caller` against every one of `limits` at `now`, whether or
    /// not they fit (what a request turned out to cost beyond its admission): what each
    /// policy reports after it. A policy that locks out and is left with nothing starts its
    /// block, as an admission that uses the quota up does.
    pub(crate) fn charge_at(
        &self,
        caller: &CallerKey,
        limits: &[Policy],
        units: u64,
        now: u64,
    ) -> CheckOutcome {
        let (hash, lock) = self.shard(caller);
        let mut guard = write(lock);
        let shard = &mut *guard;
        let position = shard.find_live(hash, caller.encoded(), now, &self.shared.hasher);
        let (entries, counters) = shard.parts();
        let mut store = Decision {
            entry: position.map(|p| &mut entries[p]),
            counters,
            fresh: None,
            key: caller.encoded(),
            now,
        };
        let mut idle_at = idle_at(limits, now);
        let outcomes: Vec<PolicyOutcome> = limits
            .iter()
            .map(|limit| {
                let state = store
                    .counters
                    .find(limit.counter_arc())
                    .and_then(|counter| store.entry.as_deref()?.state(counter));
                let charged = limit.algorithm().charge_state(state, now, units);
                // A bucket charged into debt refills from a time ahead of now.
                if let State::TokenBucket { updated_ms, .. } = charged.admitted_state {
                    idle_at = idle_at.max(updated_ms.saturating_add(limit.retention_ms()));
                }
                store.admit(limit, charged.admitted_state);
                charged.outcome
            })
            .collect();
        let mut outcome = CheckOutcome::collect(limits.len(), outcomes.into_iter()).counted_at(now);
        if limits.iter().any(|limit| limit.lockout_ms().is_some()) {
            // Only blocks that begin: a standing one is left as it is.
            lockout::start_blocks(limits, &mut outcome, now, units, |i, since_ms, until_ms| {
                if until_ms > 0 {
                    idle_at = idle_at.max(until_ms);
                    store.block(&limits[i], Block { since_ms, until_ms });
                }
            });
        }
        match (store.entry, store.fresh) {
            (Some(entry), _) => entry.keep_until(idle_at),
            (None, Some(entry)) => {
                entry.keep_until(idle_at);
                shard.insert(hash, entry, self.shared.shard_capacity, &self.shared.hasher);
            }
            (None, None) => {}
        }
        outcome
    }

    /// Forgets `caller`'s counters, if it has any (the write lock only then).
    pub(crate) fn forget(&self, caller: &CallerKey) {
        let (hash, lock) = self.shard(caller);
        if read(lock).find(hash, caller.encoded()).is_none() {
            return;
        }
        let mut shard = write(lock);
        if let Some(position) = shard.find(hash, caller.encoded()) {
            shard.remove(position, &self.shared.hasher);
        }
    }

    /// Decides a request of `cost` units now: what [`Backend::check`] answers, unwrapped.
    pub(crate) fn decide(&self, caller: &CallerKey, limits: &[Policy], cost: u64) -> CheckOutcome {
        let now = self.now_ms();
        // The usual caller, of one packed policy, by its own short path.
        if let [limit] = limits
            && let Some(outcome) = self.decide_one_at(caller, limit, cost, now)
        {
            return CheckOutcome::one(outcome).counted_at(now);
        }
        self.decide_at(caller, limits, cost, now)
    }

    /// The time on this backend's clock, in milliseconds.
    pub(crate) fn now_ms(&self) -> u64 {
        self.shared.settings.clock.now_millis()
    }

    /// Decides at `now`, read from this backend's clock by the caller: a limiter that
    /// already read the time on its way here (its breaker, open) does not read it again.
    pub(crate) fn decide_at(
        &self,
        caller: &CallerKey,
        limits: &[Policy],
        cost: u64,
        now: u64,
    ) -> CheckOutcome {
        self.decide_seeded_at(caller, limits, cost, now, |_| None)
    }

    /// Decides a request of `cost` units at `now` against the one policy `limit` for a
    /// caller this backend tracks with that policy's packed state alone (the usual caller
    /// of a limiter with one policy): what the policy reports, whether it admitted
    /// included. `None` for any other caller, which [`decide_at`](Self::decide_at) decides.
    // Inlined into its callers: returned through memory, the outcome was written in one
    // shape and read back in another, a stalled load on every decision. Always: the local
    // share's decision, a larger function, was otherwise left with a call.
    #[inline(always)]
    pub(crate) fn decide_one_at(
        &self,
        caller: &CallerKey,
        limit: &Policy,
        cost: u64,
        now: u64,
    ) -> Option<PolicyOutcome> {
        // A policy whose states never pack (a count too large for its bits) is not looked
        // up twice, here in vain and then by the general path.
        if !limit.packs_in_one_word() {
            return None;
        }
        let (hash, lock) = self.shard(caller);
        let shard = read(lock);
        if now.saturating_sub(shard.last_sweep_ms.load(Relaxed))
            >= self.shared.settings.sweep_interval_ms
        {
            return None;
        }
        let exact_idle = self.shared.settings.exact_idle;
        decide_packed_alone(&shard, hash, caller, limit, now, cost, exact_idle).outcome()
    }

    /// Decides for a caller this backend tracks with a state for each of `limits`; `None`
    /// (nothing counted) for one it does not.
    pub(crate) fn decide_tracked_at(
        &self,
        caller: &CallerKey,
        limits: &[Policy],
        cost: u64,
        now: u64,
    ) -> Option<CheckOutcome> {
        let (hash, lock) = self.shard(caller);
        let shard = read(lock);
        let exact_idle = self.shared.settings.exact_idle;
        if limits.len() <= INLINE_POLICIES
            && let Some(outcome) =
                decide_tracked(&shard, hash, caller, limits, now, cost, exact_idle)
        {
            return Some(outcome);
        }
        // Not decided under the read lock: more policies than it takes, a counter the
        // caller lacks, or the slot of a lockout newly added to a policy it has.
        let known = shard.find(hash, caller.encoded()).is_some_and(|position| {
            !shard.entries[position].is_idle(now)
                && limits.iter().all(|limit| {
                    shard
                        .counter(limit.counter_arc())
                        .is_some_and(|counter| shard.entries[position].has(counter))
                })
        });
        drop(shard);
        known.then(|| self.decide_at(caller, limits, cost, now))
    }

    /// What `limits` report for `caller` at `now` for a request of `cost` units, counting
    /// nothing.
    pub(crate) fn peek_at(
        &self,
        caller: &CallerKey,
        limits: &[Policy],
        cost: u64,
        now: u64,
    ) -> CheckOutcome {
        let (hash, lock) = self.shard(caller);
        let shard = read(lock);
        let entry = shard
            .find(hash, caller.encoded())
            .map(|position| &shard.entries[position])
            .filter(|entry| !entry.is_idle(now));
        CheckOutcome::collect(
            limits.len(),
            limits.iter().map(|limit| {
                let state = entry.and_then(|entry| {
                    let counter = shard.counter(limit.counter_arc())?;
                    let _held = entry.lock();
                    entry.state(counter)
                });
                limit.algorithm().peek_cost(state, now, cost)
            }),
        )
        .counted_at(now)
    }

    /// [`decide_at`](Self::decide_at), where a policy the caller has no state for starts
    /// from `seed(i)` for the `i`th of `limits` (a caller never seen when `None`).
    pub(crate) fn decide_seeded_at(
        &self,
        caller: &CallerKey,
        limits: &[Policy],
        cost: u64,
        now: u64,
        mut seed: impl FnMut(usize) -> Option<State>,
    ) -> CheckOutcome {
        let (hash, lock) = self.shard(caller);
        let exact_idle = self.shared.settings.exact_idle;
        {
            let shard = read(lock);
            let last_sweep_ms = shard.last_sweep_ms.load(Relaxed);
            if now.saturating_sub(last_sweep_ms) < self.shared.settings.sweep_interval_ms
                && let Some(outcome) =
                    decide_tracked(&shard, hash, caller, limits, now, cost, exact_idle)
            {
                return outcome;
            }
        }
        let mut guard = write(lock);
        let shard = &mut *guard;
        if now.saturating_sub(*shard.last_sweep_ms.get_mut())
            >= self.shared.settings.sweep_interval_ms
        {
            shard.sweep(now, &self.shared.hasher);
        }

        // One lookup for a known caller: evaluate, then write through the same entry. An
        // idle one is forgotten first, so that it starts from its seed.
        let position = shard.find_live(hash, caller.encoded(), now, &self.shared.hasher);
        let (entries, counters) = shard.parts();
        let mut store = Decision {
            entry: position.map(|p| &mut entries[p]),
            counters,
            fresh: None,
            key: caller.encoded(),
            now,
        };
        let locks = limits.iter().any(|limit| limit.lockout_ms().is_some());
        if let Some(entry) = store.entry.as_deref_mut() {
            // A refused caller is as active as an admitted one.
            entry.mark_referenced();
            for limit in limits {
                if let Some(counter) = store.counters.find(limit.counter_arc()) {
                    entry.unpack_unless_decided_by(counter, limit);
                }
            }
            if locks && let Some(refused) = blocked(entry, store.counters, limits, now, cost) {
                return refused;
            }
        }
        let mut outcome = decide(
            limits,
            &mut store,
            |store, i, limit| {
                let state = store
                    .counters
                    .find(limit.counter_arc())
                    .and_then(|counter| store.entry.as_deref()?.state(counter));
                state.or_else(|| seed(i))
            },
            now,
            cost,
            |store, i, state| store.admit(&limits[i], state),
        );
        if !outcome.admitted() {
            return outcome;
        }

        let mut idle_at = idle_at(limits, now);
        if locks {
            // Every locking policy gets its block's slot, so that the next decision finds
            // the caller complete under the read lock.
            lockout::start_blocks(limits, &mut outcome, now, cost, |i, since_ms, until_ms| {
                idle_at = idle_at.max(until_ms);
                store.block(&limits[i], Block { since_ms, until_ms });
            });
        }
        match (store.entry, store.fresh) {
            (Some(entry), _) => entry.keep_until(idle_at),
            (None, Some(entry)) => {
                entry.keep_until(idle_at);
                shard.insert(hash, entry, self.shared.shard_capacity, &self.shared.hasher);
            }
            // No policies: nothing to count.
            (None, None) => {}
        }
        outcome
    }
}

/// Decides for a caller the shard tracks with one packed counter, the one of `limit` (a
/// policy without a lockout): one compare-and-swap under the shard's read lock, no lock of
/// the caller's. [`NOT_PACKED`](PackedDecision::NOT_PACKED) when that is not the case (or the
/// caller is not tracked); [`DOES_NOT_FIT`](PackedDecision::DOES_NOT_FIT) when the state to
/// write does not fit its packing, which only the write lock may then decide (it unpacks
/// the slot): never the caller's own lock, beside compare-and-swaps on the same word.
#[inline]
fn decide_packed_alone(
    shard: &Shard,
    hash: u64,
    caller: &CallerKey,
    limit: &Policy,
    now: u64,
    cost: u64,
    exact_idle: bool,
) -> PackedDecision {
    if limit.lockout_ms().is_some() {
        return PackedDecision::NOT_PACKED;
    }
    let (Some(position), Some(counter)) = (
        shard.find(hash, caller.encoded()),
        shard.counter(limit.counter_arc()),
    ) else {
        return PackedDecision::NOT_PACKED;
    };
    let entry = &shard.entries[position];
    if entry.is_idle(now) {
        return PackedDecision::NOT_PACKED;
    }
    let (decided, counted_from_ms) = entry.decide_packed(counter, limit, now, cost, exact_idle);
    if let Some(outcome) = decided.outcome() {
        // A refused caller is as active as an admitted one.
        entry.mark_referenced();
        if outcome.admitted {
            if exact_idle {
                // Exactly until the state written stops weighing: a window's time moves
                // once a window, so it is written about that often, not on every decision
                // of a caller that comes back.
                entry.keep_until(counted_from_ms.saturating_add(limit.retention_ms()));
            } else {
                // Kept a little longer than needed (a state that no longer weighs decides
                // as a new caller's would), so that the time is written once in a while.
                let until_ms = now.saturating_add(limit.retention_ms());
                entry.keep_until_about(until_ms, limit.keep_slack_ms());
            }
        }
    }
    decided
}

/// Decides for a caller the shard already tracks with a state for each of `limits`, under
/// the shard's read lock: by compare-and-swap for one packed policy, otherwise under the
/// caller's own lock. `None` when the caller or one of its counters is new, or a packed
/// state stops fitting: that needs the write lock.
fn decide_tracked(
    shard: &Shard,
    hash: u64,
    caller: &CallerKey,
    limits: &[Policy],
    now: u64,
    cost: u64,
    exact_idle: bool,
) -> Option<CheckOutcome> {
    if limits.len() > INLINE_POLICIES {
        return None;
    }
    // A policy whose states never pack is not looked up twice, in vain and then below.
    if let [limit] = limits
        && limit.packs_in_one_word()
    {
        let decided = decide_packed_alone(shard, hash, caller, limit, now, cost, exact_idle);
        if let Some(outcome) = decided.outcome() {
            return Some(CheckOutcome::one(outcome).counted_at(now));
        }
        if decided == PackedDecision::DOES_NOT_FIT {
            return None;
        }
    }
    let entry = &shard.entries[shard.find(hash, caller.encoded())?];
    // A packed state is written through a shared reference only by compare-and-swap
    // (above): any other write may have to unpack it, which takes the shard's write lock.
    if entry.is_idle(now) || entry.is_packed() {
        return None;
    }
    let mut counters = [0u32; INLINE_POLICIES];
    // Each locking policy's block slot; the fast path needs the caller to have them all.
    let mut blocks = [None; INLINE_POLICIES];
    for ((counter, block), limit) in counters.iter_mut().zip(&mut blocks).zip(limits) {
        *counter = shard.counter(limit.counter_arc())?;
        if !entry.has(*counter) {
            return None;
        }
        if let Some(id) = limit.lockout_arc() {
            let slot = shard.counter(id)?;
            if !entry.has(slot) {
                return None;
            }
            *block = Some(slot);
        }
    }
    let locks = blocks.iter().any(Option::is_some);
    let _held = entry.lock();
    // A refused caller is as active as an admitted one.
    entry.mark_referenced();
    if locks {
        let until = |i: usize| {
            blocks[i]
                .and_then(|slot| entry.block(slot))
                .map_or(0, |b| b.until_ms)
        };
        for (i, limit) in limits.iter().enumerate() {
            let ended = until(i);
            if ended != 0 && ended <= now {
                if let Some(slot) = blocks[i] {
                    entry.update_block(slot, Block::default());
                }
                entry.update(counters[i], lockout::fresh(limit, now));
            }
        }
        if let Some(refused) =
            lockout::refusal(limits, now, cost, until, |i| entry.state(counters[i]))
        {
            return Some(refused);
        }
    }
    let mut outcome = decide(
        limits,
        &mut (),
        |_, i, _| entry.state(counters[i]),
        now,
        cost,
        |_, i, state| entry.update(counters[i], state),
    );
    if outcome.admitted() {
        let mut idle_at = idle_at(limits, now);
        if locks {
            lockout::start_blocks(limits, &mut outcome, now, cost, |i, since_ms, until_ms| {
                idle_at = idle_at.max(until_ms);
                if let Some(slot) = blocks[i] {
                    entry.update_block(slot, Block { since_ms, until_ms });
                }
            });
        }
        entry.keep_until(idle_at);
    }
    Some(outcome)
}

/// The refusal of a tracked caller by a standing block, if one stands at `now`; a block
/// that has ended is cleared and leaves its policy's counter fresh.
fn blocked(
    entry: &mut Entry,
    counters: &Counters,
    limits: &[Policy],
    now: u64,
    cost: u64,
) -> Option<CheckOutcome> {
    let slot = |limit: &Policy| limit.lockout_arc().and_then(|id| counters.find(id));
    for limit in limits {
        let Some(slot) = slot(limit) else { continue };
        let Some(block) = entry.block(slot) else {
            continue;
        };
        if block.until_ms != 0 && block.until_ms <= now {
            entry.store_block(slot, Block::default());
            if let Some(counter) = counters.find(limit.counter_arc())
                && entry.has(counter)
            {
                entry.store(counter, lockout::fresh(limit, now));
            }
        }
    }
    let entry = &*entry;
    lockout::refusal(
        limits,
        now,
        cost,
        |i| {
            slot(&limits[i])
                .and_then(|slot| entry.block(slot))
                .map_or(0, |b| b.until_ms)
        },
        |i| {
            counters
                .find(limits[i].counter_arc())
                .and_then(|c| entry.state(c))
        },
    )
}

/// Until when an admission keeps a caller tracked: its counters matter that long.
fn idle_at(limits: &[Policy], now: u64) -> u64 {
    limits
        .iter()
        .map(|l| now.saturating_add(l.retention_ms()))
        .max()
        .unwrap_or(now)
}

/// What one decision reads and writes in its shard: the caller's entry if tracked, else
/// the entry made for it once every policy admitted.
struct Decision<'a> {
    entry: Option<&'a mut Entry>,
    counters: &'a mut Counters,
    fresh: Option<Entry>,
    key: &'a [u8],
    /// When the decision is made: a new entry's packed state counts from it.
    now: u64,
}

impl Decision<'_> {
    /// Writes a locking policy's block, once the request was admitted (so the entry exists).
    fn block(&mut self, limit: &Policy, block: Block) {
        let Some(id) = limit.lockout_arc() else {
            return;
        };
        let slot = self.counters.intern(id);
        if let Some(entry) = self.entry.as_deref_mut().or(self.fresh.as_mut()) {
            entry.store_block(slot, block);
        }
    }

    fn admit(&mut self, limit: &Policy, state: State) {
        let counter = self.counters.intern(limit.counter_arc());
        match (&mut self.entry, &mut self.fresh) {
            (Some(entry), _) => entry.store(counter, state),
            (None, Some(fresh)) => fresh.store(counter, state),
            (None, None) => {
                let packing = Packing::of(limit.algorithm(), self.now);
                self.fresh = Some(Entry::new(self.key, counter, state, packing));
            }
        }
    }
}

/// What an [`InMemoryBackend`] is made with.
#[derive(Clone, Debug)]
#[repr(C)]
struct Settings {
    // Read by every decision: first, beside the shards (see `Shared`).
    clock: Arc<dyn Clock>,
    sweep_interval_ms: u64,
    max_keys: usize,
    shards: usize,
    /// Whether a caller is forgotten as soon as its states affect no decision (a local
    /// share's store, which starts a caller it does not count from the store's last
    /// answer), rather than up to a sixteenth of its retention later.
    exact_idle: bool,
}

impl Default for InMemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InMemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryBackend")
            .field("shards", &self.shared.shards.len())
            .field("max_keys", &self.shared.max_keys)
            .field("clock", &self.shared.settings.clock)
            .finish_non_exhaustive()
    }
}

impl Backend for InMemoryBackend {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        StoreFuture::ready(Ok(self.decide(caller, limits, cost)))
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        self.give_back(caller, limits, refund);
        StoreFuture::ready(Ok(()))
    }

    fn charge(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let now = self.now_ms();
        StoreFuture::ready(Ok(self.charge_at(caller, limits, units, now)))
    }

    fn lease(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        let grant = super::lease::lease_by_checks(self, caller, limits, cost, units);
        Some(StoreFuture::ready(grant))
    }

    fn is_remote(&self) -> bool {
        false
    }
}

// A panic while a shard was locked cannot leave its map inconsistent (every update is a
// single insert or assignment), so a poisoned lock is still safe to use.
fn read(shard: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    shard
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(shard: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    shard
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::algorithm::Algorithm;
    use crate::store::clock::ManualClock;

    fn per_second(limit: u64) -> Arc<[Policy]> {
        vec![Policy::new(
            "per-second",
            Algorithm::sliding_window(limit, Duration::from_secs(1)),
        )]
        .into()
    }

    /// Whether `caller`'s state is packed in its entry (`None`: not tracked).
    fn is_packed(backend: &InMemoryBackend, caller: &CallerKey) -> Option<bool> {
        let (hash, lock) = backend.shard(caller);
        let shard = read(lock);
        let position = shard.find(hash, caller.encoded())?;
        Some(shard.entries[position].is_packed())
    }

    /// The same counter under a limit too large to pack (a limits swap), then back: the
    /// packed state is unpacked by the write lock, and the count carries on through both.
    #[test]
    fn a_packed_caller_keeps_its_count_through_a_limit_that_does_not_pack() {
        let clock = ManualClock::new(1_800_000_000_000);
        let backend = InMemoryBackend::new().clock(clock.clone());
        let (small, huge) = (per_second(10), per_second(1 << 40));
        assert!(small[0].packs_in_one_word() && !huge[0].packs_in_one_word());
        let acme = CallerKey::new("acme");
        let remaining = |outcome: CheckOutcome| {
            assert!(outcome.admitted());
            outcome.limits()[0].remaining
        };
        for _ in 0..5 {
            backend.decide(&acme, &small, 1);
        }
        assert_eq!(is_packed(&backend, &acme), Some(true));
        assert_eq!(remaining(backend.decide(&acme, &huge, 1)), (1 << 40) - 6);
        // Kept beside from then on: decided under the caller's lock, not the shard's
        // write lock each time.
        assert_eq!(is_packed(&backend, &acme), Some(false));
        assert_eq!(remaining(backend.decide(&acme, &huge, 1)), (1 << 40) - 7);
        for left in (0..3).rev() {
            assert_eq!(remaining(backend.decide(&acme, &small, 1)), left);
        }
        assert!(!backend.decide(&acme, &small, 1).admitted());
        // Another caller, never swapped, still decides by its word.
        let globex = CallerKey::new("globex");
        for left in (0..10).rev() {
            assert_eq!(remaining(backend.decide(&globex, &small, 1)), left);
        }
        assert!(!backend.decide(&globex, &small, 1).admitted());
        assert_eq!(is_packed(&backend, &globex), Some(true));
    }

    /// A bucket whose rate changes under the same counter packs its level in other units:
    /// its state moves beside, and its level carries on.
    #[test]
    fn a_packed_bucket_whose_rate_changes_keeps_its_level() {
        let clock = ManualClock::new(1_800_000_000_000);
        let backend = InMemoryBackend::new().clock(clock.clone());
        let bucket = |rate: u64| -> Arc<[Policy]> {
            vec![Policy::new(
                "burst",
                Algorithm::token_bucket(rate, Duration::from_secs(1), 10),
            )]
            .into()
        };
        let (tens, sevens) = (bucket(10), bucket(7));
        assert_eq!(tens[0].counter(), sevens[0].counter());
        let acme = CallerKey::new("acme");
        for _ in 0..4 {
            assert!(backend.decide(&acme, &tens, 1).admitted());
        }
        assert_eq!(is_packed(&backend, &acme), Some(true));
        // Six tokens left, with no time passing: six more, then none.
        for left in (0..6).rev() {
            let outcome = backend.decide(&acme, &sevens, 1);
            assert!(outcome.admitted());
            assert_eq!(outcome.limits()[0].remaining, left);
        }
        assert_eq!(is_packed(&backend, &acme), Some(false));
        assert!(!backend.decide(&acme, &sevens, 1).admitted());
    }

    /// Threads deciding three callers under two buckets of one counter, whose rates pack
    /// in other units, picked at random for each decision: each caller's state moves from
    /// its word to its lock while the others decide, and with the clock still, no caller is
    /// admitted more than its burst, nor fewer.
    #[test]
    fn racing_decisions_across_a_change_of_packing_admit_exactly_the_burst() {
        use std::sync::atomic::AtomicU64;

        const BURST: u64 = 200;
        let clock = ManualClock::new(1_800_000_000_000);
        let backend = InMemoryBackend::new().clock(clock.clone());
        let bucket = |rate: u64| -> Arc<[Policy]> {
            vec![Policy::new(
                "burst",
                Algorithm::token_bucket(rate, Duration::from_secs(1), BURST),
            )]
            .into()
        };
        let buckets = [bucket(10), bucket(7)];
        let callers: Vec<CallerKey> = ["acme", "globex", "initech"]
            .into_iter()
            .map(CallerKey::new)
            .collect();
        let admitted: Vec<AtomicU64> = callers.iter().map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let (backend, buckets, callers, admitted) =
                    (&backend, &buckets, &callers, &admitted);
                scope.spawn(move || {
                    // A small generator of its own per thread: which caller, which bucket.
                    let mut seed = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(thread + 1);
                    for _ in 0..2_000 {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let who = (seed % 3) as usize;
                        // Mostly the packed bucket, so that the word is decided often.
                        let limits = &buckets[usize::from(seed >> 8 & 7 == 0)];
                        if backend.decide(&callers[who], limits, 1).admitted() {
                            admitted[who].fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        for (caller, admitted) in callers.iter().zip(&admitted) {
            assert_eq!(admitted.load(Relaxed), BURST, "{caller:?}");
        }
    }

    #[test]
    fn idle_callers_are_swept() {
        let clock = ManualClock::new(1_000);
        let backend = InMemoryBackend::new()
            .sweep_interval(Duration::from_secs(1))
            .clock(clock.clone());
        let limits = per_second(5);
        for i in 0..100 {
            backend.decide(&CallerKey::new(format!("c{i}")), &limits, 1);
        }
        assert_eq!(backend.tracked_keys(), 100);
        clock.advance(Duration::from_secs(3));
        // Sweeps run on the shards that see traffic; touch them all.
        for i in 0..1_000 {
            backend.decide(&CallerKey::new(format!("late{i}")), &limits, 1);
        }
        assert_eq!(backend.tracked_keys(), 1_000);
    }

    #[test]
    fn the_cap_holds_and_evicts_the_least_recent() {
        let clock = ManualClock::new(0);
        let backend = InMemoryBackend::new()
            .max_keys(64)
            .shards(1)
            .clock(clock.clone());
        let limits = per_second(5);
        let acme = CallerKey::new("acme");
        for i in 0..10_000 {
            clock.advance(Duration::from_millis(1));
            backend.decide(&acme, &limits, 1);
            backend.decide(&CallerKey::new(format!("flood{i}")), &limits, 1);
            assert!(backend.tracked_keys() <= 64);
        }
        // acme, busy throughout, is still limited.
        let outcome = backend.decide(&acme, &limits, 1);
        assert!(!outcome.admitted());
    }

    fn bucket(per_second: u64) -> Arc<[Policy]> {
        vec![Policy::new(
            "bucket",
            Algorithm::token_bucket(per_second, Duration::from_secs(1), per_second),
        )]
        .into()
    }

    #[test]
    fn an_idle_caller_starts_from_its_seed_not_from_its_refilled_state() {
        let clock = ManualClock::new(1_000);
        let backend = InMemoryBackend::new().clock(clock.clone());
        let limits = bucket(5);
        let acme = CallerKey::new("acme");
        assert!(backend.decide(&acme, &limits, 1).admitted());
        // Past the bucket's refill, unswept: the caller's state affects nothing.
        clock.advance(Duration::from_secs(2));
        let now = backend.now_ms();
        assert!(backend.decide_one_at(&acme, &limits[0], 1, now).is_none());
        assert!(backend.decide_tracked_at(&acme, &limits, 1, now).is_none());
        // Seeded empty (what another counter knew of the caller), it is refused.
        let empty = State::TokenBucket {
            level: 0,
            updated_ms: now,
        };
        let outcome = backend.decide_seeded_at(&acme, &limits, 1, now, |_| Some(empty.clone()));
        assert!(!outcome.admitted());
    }

    #[test]
    fn forgetting_idle_callers_keeps_the_others_counted() {
        let clock = ManualClock::new(1_000);
        let backend = InMemoryBackend::new()
            .max_keys(1_000)
            .shards(1)
            .clock(clock.clone());
        let limits = per_second(3);
        for i in 0..50 {
            backend.decide(&CallerKey::new(format!("idle{i}")), &limits, 1);
        }
        clock.advance(Duration::from_secs(5));
        for i in 0..50 {
            backend.decide(&CallerKey::new(format!("busy{i}")), &limits, 3);
        }
        // Every idle caller comes back (and is forgotten first, the last moving into its
        // place): each is fresh, and each busy one still has nothing left.
        for i in 0..50 {
            assert!(
                backend
                    .decide(&CallerKey::new(format!("idle{i}")), &limits, 3)
                    .admitted()
            );
        }
        for i in 0..50 {
            let key = CallerKey::new(format!("busy{i}"));
            assert!(!backend.decide(&key, &limits, 1).admitted(), "busy{i}");
        }
        assert_eq!(backend.tracked_keys(), 100);
    }

    /// When the only shard's only caller is idle, after `decide` at each of `times`.
    fn idle_at_after(backend: &InMemoryBackend, clock: &ManualClock, times: &[u64]) -> u64 {
        idle_at_after_under(&per_second(1_000), backend, clock, times)
    }

    /// [`idle_at_after`] under `limits`.
    fn idle_at_after_under(
        limits: &Arc<[Policy]>,
        backend: &InMemoryBackend,
        clock: &ManualClock,
        times: &[u64],
    ) -> u64 {
        let acme = CallerKey::new("acme");
        for &at in times {
            clock.advance(Duration::from_millis(at - backend.now_ms()));
            assert!(backend.decide(&acme, limits, 1).admitted());
        }
        let shard = read(&backend.shared.shards[0]);
        shard.entries[0].idle_at_ms()
    }

    #[test]
    fn a_caller_that_comes_back_is_kept_at_most_a_sixteenth_of_its_retention_longer() {
        // A window of a second is kept two: past that, its state weighs nothing.
        let times = [1_000, 1_010, 1_300, 1_301];
        let clock = ManualClock::new(1_000);
        let backend = InMemoryBackend::new()
            .max_keys(1_000)
            .shards(1)
            .clock(clock.clone());
        let idle_at = idle_at_after(&backend, &clock, &times);
        assert!(
            (3_301..3_301 + 2_000 / 16).contains(&idle_at),
            "kept until {idle_at}"
        );
        // The first request, and those that found the time already far enough, wrote it
        // once each: 3_010 rounded up to 3_071, then 3_300 to 3_327.
        assert_eq!(idle_at, 3_327);

        // A local share's counters are forgotten as soon as they weigh nothing: the
        // window from 1,000 to 2,000 weighs nothing from 3,000 on.
        let exact_store = || {
            let clock = ManualClock::new(1_000);
            let backend = InMemoryBackend::new()
                .max_keys(1_000)
                .shards(1)
                .clock(clock.clone())
                .exact_idle_times();
            (backend, clock)
        };
        let (exact, clock) = exact_store();
        assert_eq!(idle_at_after(&exact, &clock, &times), 3_000);
        // The next window's requests weigh until its next window ends.
        let (exact, clock) = exact_store();
        assert_eq!(idle_at_after(&exact, &clock, &[1_000, 1_300, 2_001]), 4_000);
        // A bucket of 1,000 a second, full again a second after its last request.
        let (exact, clock) = exact_store();
        let limits = bucket(1_000);
        assert_eq!(idle_at_after_under(&limits, &exact, &clock, &times), 2_301);
    }

    #[test]
    fn no_shard_holds_more_callers_than_a_16_bit_position_names() {
        let backend = InMemoryBackend::new().max_keys(200_000).shards(1);
        assert_eq!(backend.shared.shards.len(), 4);
        assert_eq!(backend.shared.shard_capacity, 50_000);
        assert_eq!(InMemoryBackend::new().shared.shards.len(), 64);

        // One shard full to the last place: every caller is found again.
        let full = InMemoryBackend::new()
            .max_keys(MAX_SHARD_KEYS)
            .shards(1)
            .clock(ManualClock::new(1_000));
        assert_eq!(full.shared.shards.len(), 1);
        let limits = per_second(1);
        let keys: Vec<CallerKey> = (0..MAX_SHARD_KEYS)
            .map(|i| CallerKey::new(format!("k{i}")))
            .collect();
        for key in &keys {
            assert!(full.decide(key, &limits, 1).admitted());
        }
        assert_eq!(full.tracked_keys(), MAX_SHARD_KEYS);
        assert!(
            keys.iter()
                .all(|key| !full.decide(key, &limits, 1).admitted())
        );
    }

    #[test]
    fn a_bucket_in_debt_is_kept_until_it_has_refilled() {
        let clock = ManualClock::new(1_000);
        let backend = InMemoryBackend::new().clock(clock.clone());
        let limits = bucket(5);
        let acme = CallerKey::new("acme");
        assert!(backend.decide(&acme, &limits, 1).admitted());
        // 20 units more than it had: four seconds of refill owed.
        backend.charge_at(&acme, &limits, 20, backend.now_ms());
        clock.advance(Duration::from_secs(2));
        assert!(!backend.decide(&acme, &limits, 1).admitted());
    }
}
