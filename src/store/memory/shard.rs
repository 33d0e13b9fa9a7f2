//! One shard of the in-process store: callers in a dense vector, found through a table of
//! indices by their key's hash, and evicted by a CLOCK hand that walks the vector.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use super::counters::Counters;
use super::entry::Entry;

/// The keyed hash of a caller's encoded key: it picks the shard, then the table slot.
pub(super) type KeyHasher = RandomState;

/// The most callers one shard holds, so that a caller's position fits the index's 16 bits.
pub(super) const MAX_SHARD_KEYS: usize = 1 << 16;

/// `position` as the index holds it: below [`MAX_SHARD_KEYS`], as every shard's capacity is.
fn indexed(position: usize) -> u16 {
    debug_assert!(
        position < MAX_SHARD_KEYS,
        "position {position} past a shard's room"
    );
    position as u16
}

#[derive(Default)]
pub(super) struct Shard {
    /// Indices into `entries`, found by the key's hash. Each key is stored once, in its
    /// entry; the table holds 3 bytes per caller (its control byte and a 16-bit position),
    /// small enough to stay in a core's cache beside the entries it leads to.
    index: HashTable<u16>,
    pub(super) entries: Vec<Entry>,
    /// The eviction hand (the CLOCK algorithm): a caller seen since the hand last passed
    /// gets a second chance, so callers that keep sending stay tracked while a flood of
    /// one-off keys evicts itself. A new caller takes the evicted one's place, behind the
    /// hand, so it too has a whole round to come back.
    hand: usize,
    /// The counter identities seen by this shard; entries name a counter by its index.
    counters: Counters,
    /// When the shard was last swept; read under the read lock to tell whether a decision
    /// must take the write lock and sweep first.
    pub(super) last_sweep_ms: AtomicU64,
}

impl Shard {
    /// The position of the caller whose key is `key` (hashed to `hash`), if tracked.
    #[inline]
    pub(super) fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(hash, |&i| entries[i as usize].key() == key)
            .map(|&i| i as usize)
    }

    /// The index of a counter this shard has stored, if any.
    #[inline]
    pub(super) fn counter(&self, name: &Arc<str>) -> Option<u32> {
        self.counters.find(name)
    }

    /// The entries and the counter list, borrowed apart so that a decision can read and
    /// write an entry while naming counters.
    pub(super) fn parts(&mut self) -> (&mut [Entry], &mut Counters) {
        (&mut self.entries, &mut self.counters)
    }

    /// Adds a caller, in the place of the first caller under the eviction hand not seen
    /// since it last passed when the shard is full. (Idle callers went first: the decision
    /// sweeps the shard whenever a sweep interval has passed, at most once per interval so
    /// that a flood does not rescan the shard on every key.)
    pub(super) fn insert(&mut self, hash: u64, entry: Entry, capacity: usize, hasher: &KeyHasher) {
        let position = if self.entries.len() >= capacity && !self.entries.is_empty() {
            let victim = self.next_victim();
            self.unindex(victim, hasher);
            self.entries[victim] = entry;
            victim
        } else {
            self.entries.push(entry);
            self.entries.len() - 1
        };
        let entries = &self.entries;
        self.index.insert_unique(hash, indexed(position), |&i| {
            hasher.hash_one(entries[i as usize].key())
        });
    }

    /// Forgets every caller idle at `now`.
    pub(super) fn sweep(&mut self, now: u64, hasher: &KeyHasher) {
        let before = self.entries.len();
        self.entries.retain(|entry| entry.idle_at_ms() > now);
        *self.last_sweep_ms.get_mut() = now;
        if self.entries.len() == before {
            return;
        }
        // Positions moved: index the survivors afresh.
        self.index.clear();
        let entries = &self.entries;
        for (position, entry) in entries.iter().enumerate() {
            self.index
                .insert_unique(hasher.hash_one(entry.key()), indexed(position), |&i| {
                    hasher.hash_one(entries[i as usize].key())
                });
        }
        if self.hand >= self.entries.len() {
            self.hand = 0;
        }
    }

    /// The position of the caller whose counters still affect a decision at `now_ms`; an
    /// idle one is forgotten on the way (with the write lock), so that it is decided as
    /// never seen rather than from states that have long run out.
    pub(super) fn find_live(
        &mut self,
        hash: u64,
        key: &[u8],
        now_ms: u64,
        hasher: &KeyHasher,
    ) -> Option<usize> {
        let position = self.find(hash, key)?;
        if self.entries[position].is_idle(now_ms) {
            self.remove(position, hasher);
            return None;
        }
        Some(position)
    }

    /// Forgets the caller at `position`; the last caller takes its place.
    pub(super) fn remove(&mut self, position: usize, hasher: &KeyHasher) {
        let last = self.entries.len() - 1;
        self.unindex(position, hasher);
        if position != last {
            self.unindex(last, hasher);
        }
        self.entries.swap_remove(position);
        if position != last {
            let entries = &self.entries;
            self.index.insert_unique(
                hasher.hash_one(entries[position].key()),
                indexed(position),
                |&i| hasher.hash_one(entries[i as usize].key()),
            );
        }
        if self.hand >= self.entries.len() {
            self.hand = 0;
        }
    }

    /// Moves the hand to the first caller not seen since it last passed, clearing the marks
    /// on the way; that caller's position. Ends within two rounds: the first clears every
    /// mark. The shard holds at least one caller.
    fn next_victim(&mut self) -> usize {
        loop {
            if self.hand >= self.entries.len() {
                self.hand = 0;
            }
            let position = self.hand;
            self.hand += 1;
            if !self.entries[position].take_referenced() {
                return position;
            }
        }
    }

    /// Takes the caller at `position` out of the table (its entry is about to be replaced).
    fn unindex(&mut self, position: usize, hasher: &KeyHasher) {
        let hash = hasher.hash_one(self.entries[position].key());
        if let Ok(found) = self.index.find_entry(hash, |&i| i as usize == position) {
            found.remove();
        }
    }
}
