//! One tracked caller: its key, kept once and inline when short, and its counters' states,
//! the first inline and any others beside it.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};

use crate::store::algorithm::PolicyState;
use crate::store::inline_bytes::InlineBytes;

/// Keys up to this many encoded bytes live inside the entry; longer ones (up to a tag and
/// [`MAX_KEY_BYTES`](crate::store::CallerKey::MAX_KEY_BYTES)) take one heap block. 22 keeps the key
/// as small as the boxed form it replaces.
const INLINE_KEY_BYTES: usize = 22;

/// A caller's encoded key, as the shard stores it.
type StoredKey = InlineBytes<INLINE_KEY_BYTES>;

/// A counter's state, read and written through a shared reference. The entry's lock makes
/// a decision's reads and writes one step; the atomics, all relaxed, only let safe code
/// write through `&`.
struct SharedState {
    kind: AtomicU8,
    a: AtomicU64,
    b: AtomicU64,
    c: AtomicU64,
}

const SLIDING_WINDOW: u8 = 1;
const TOKEN_BUCKET: u8 = 2;
/// A lockout's block, kept under its own counter: `a` is when it began, `b` when it ends
/// (0: no block).
const BLOCK: u8 = 3;

impl SharedState {
    fn new(state: PolicyState) -> Self {
        let shared = Self {
            kind: AtomicU8::new(0),
            a: AtomicU64::new(0),
            b: AtomicU64::new(0),
            c: AtomicU64::new(0),
        };
        shared.store(state);
        shared
    }

    fn block() -> Self {
        Self {
            kind: AtomicU8::new(BLOCK),
            a: AtomicU64::new(0),
            b: AtomicU64::new(0),
            c: AtomicU64::new(0),
        }
    }

    fn load_block(&self) -> Option<Block> {
        (self.kind.load(Relaxed) == BLOCK).then(|| Block {
            since_ms: self.a.load(Relaxed),
            until_ms: self.b.load(Relaxed),
        })
    }

    fn store_block(&self, block: Block) {
        self.kind.store(BLOCK, Relaxed);
        self.a.store(block.since_ms, Relaxed);
        self.b.store(block.until_ms, Relaxed);
    }

    fn load(&self) -> PolicyState {
        let (a, b) = (self.a.load(Relaxed), self.b.load(Relaxed));
        match self.kind.load(Relaxed) {
            TOKEN_BUCKET => PolicyState::TokenBucket {
                level: a,
                updated_ms: b,
            },
            _ => PolicyState::SlidingWindow {
                window_start: a,
                previous: b,
                current: self.c.load(Relaxed),
            },
        }
    }

    fn store(&self, state: PolicyState) {
        match state {
            PolicyState::SlidingWindow {
                window_start,
                previous,
                current,
            } => {
                self.kind.store(SLIDING_WINDOW, Relaxed);
                self.a.store(window_start, Relaxed);
                self.b.store(previous, Relaxed);
                self.c.store(current, Relaxed);
            }
            PolicyState::TokenBucket { level, updated_ms } => {
                self.kind.store(TOKEN_BUCKET, Relaxed);
                self.a.store(level, Relaxed);
                self.b.store(updated_ms, Relaxed);
            }
        }
    }
}

/// A caller's block by a lockout: refused from `since_ms` until `until_ms` (none when
/// `until_ms` is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Block {
    pub(crate) since_ms: u64,
    pub(crate) until_ms: u64,
}

/// A counter's state beyond the entry's first one.
struct Slot {
    counter: u32,
    state: SharedState,
}

/// A tracked caller. Counters are named by their index in the shard's counter list, so an
/// entry holds no name; most limiters apply one policy, whose state sits in the entry.
///
/// A decision on a tracked caller runs under the shard's read lock and this entry's own
/// lock, so decisions for other callers of the shard go on beside it; adding a caller or
/// a counter, evicting and sweeping take the shard's write lock.
pub(super) struct Entry {
    key: StoredKey,
    /// After this instant the entry's counters affect no decision.
    idle_at_ms: AtomicU64,
    first_state: SharedState,
    // A thin pointer (8 bytes, where a `Vec` takes 24 and a boxed slice 16): rare, and
    // every tracked caller pays for the field.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<Slot>>>,
    first_counter: u32,
    /// Seen since the eviction hand last passed, refused requests included.
    referenced: AtomicBool,
    /// Held by the decision reading and writing the states through a shared reference.
    busy: AtomicBool,
}

/// Spins this many times on a held entry before yielding the thread: a decision holds it
/// for tens of nanoseconds, unless its thread was preempted.
const SPINS_BEFORE_YIELD: u32 = 64;

/// An entry's lock, held; released when dropped (on unwinding too).
pub(super) struct EntryGuard<'a> {
    entry: &'a Entry,
}

impl Drop for EntryGuard<'_> {
    fn drop(&mut self) {
        self.entry.busy.store(false, Release);
    }
}

impl Entry {
    /// A caller's first entry, holding one counter's state.
    pub(super) fn new(key: &[u8], counter: u32, state: PolicyState) -> Self {
        Self {
            key: StoredKey::new(key),
            idle_at_ms: AtomicU64::new(0),
            first_state: SharedState::new(state),
            more: None,
            first_counter: counter,
            referenced: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        }
    }

    pub(super) fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    /// Takes the entry's lock, for a decision through a shared reference.
    pub(super) fn lock(&self) -> EntryGuard<'_> {
        let mut spins = 0;
        while self
            .busy
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            while self.busy.load(Relaxed) {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        EntryGuard { entry: self }
    }

    fn slot(&self, counter: u32) -> Option<&SharedState> {
        if self.first_counter == counter {
            return Some(&self.first_state);
        }
        self.more
            .as_ref()?
            .iter()
            .find(|slot| slot.counter == counter)
            .map(|slot| &slot.state)
    }

    /// Whether the entry holds a state for `counter`.
    pub(super) fn has(&self, counter: u32) -> bool {
        self.slot(counter).is_some()
    }

    pub(super) fn state(&self, counter: u32) -> Option<PolicyState> {
        self.slot(counter).map(SharedState::load)
    }

    /// Writes the state of a counter the entry holds (see [`has`](Self::has)); under the
    /// entry's lock.
    pub(super) fn update(&self, counter: u32, state: PolicyState) {
        if let Some(slot) = self.slot(counter) {
            slot.store(state);
        }
    }

    /// Writes a counter's state, adding the counter if the entry does not hold it yet.
    pub(super) fn store(&mut self, counter: u32, state: PolicyState) {
        if let Some(slot) = self.slot(counter) {
            slot.store(state);
            return;
        }
        self.more.get_or_insert_with(Default::default).push(Slot {
            counter,
            state: SharedState::new(state),
        });
    }

    /// The block kept under `counter`, if the entry has a slot for it.
    pub(super) fn block(&self, counter: u32) -> Option<Block> {
        self.slot(counter).and_then(SharedState::load_block)
    }

    /// Writes the block of a slot the entry holds; under the entry's lock.
    pub(super) fn update_block(&self, counter: u32, block: Block) {
        if let Some(slot) = self.slot(counter) {
            slot.store_block(block);
        }
    }

    /// Writes a block, adding its slot if the entry has none yet.
    pub(super) fn store_block(&mut self, counter: u32, block: Block) {
        if let Some(slot) = self.slot(counter) {
            slot.store_block(block);
            return;
        }
        let state = SharedState::block();
        state.store_block(block);
        self.more
            .get_or_insert_with(Default::default)
            .push(Slot { counter, state });
    }

    pub(super) fn idle_at_ms(&self) -> u64 {
        self.idle_at_ms.load(Relaxed)
    }

    /// Keeps the entry until `idle_at_ms` at least; under the entry's lock or the shard's
    /// write lock.
    pub(super) fn keep_until(&self, idle_at_ms: u64) {
        if idle_at_ms > self.idle_at_ms.load(Relaxed) {
            self.idle_at_ms.store(idle_at_ms, Relaxed);
        }
    }

    /// Marks the caller as seen since the eviction hand last passed.
    pub(super) fn mark_referenced(&self) {
        self.referenced.store(true, Relaxed);
    }

    /// Whether the caller was seen since the hand last passed; clears the mark.
    pub(super) fn take_referenced(&mut self) -> bool {
        std::mem::replace(self.referenced.get_mut(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_kept_apart() {
        let window = |current| PolicyState::SlidingWindow {
            window_start: 0,
            previous: 0,
            current,
        };
        let mut entry = Entry::new(b"=acme", 3, window(1));
        assert_eq!(entry.state(3), Some(window(1)));
        assert_eq!(entry.state(0), None);
        entry.store(0, window(7));
        entry.store(3, window(2));
        assert_eq!(entry.state(0), Some(window(7)));
        assert_eq!(entry.state(3), Some(window(2)));
        let bucket = PolicyState::TokenBucket {
            level: u64::MAX - 1,
            updated_ms: 1_700_000_000_000,
        };
        let _held = entry.lock();
        assert!(entry.has(0) && !entry.has(5));
        entry.update(0, bucket);
        entry.update(5, bucket);
        assert_eq!(entry.state(0), Some(bucket));
        assert_eq!(entry.state(5), None);
    }

    #[test]
    fn the_lock_serializes_decisions_across_threads() {
        let entry = Entry::new(
            b"=acme",
            0,
            PolicyState::TokenBucket {
                level: 0,
                updated_ms: 0,
            },
        );
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10_000 {
                        let _held = entry.lock();
                        let Some(PolicyState::TokenBucket { level, updated_ms }) = entry.state(0)
                        else {
                            unreachable!("a token bucket was stored");
                        };
                        entry.update(
                            0,
                            PolicyState::TokenBucket {
                                level: level + 1,
                                updated_ms,
                            },
                        );
                    }
                });
            }
        });
        assert_eq!(
            entry.state(0),
            Some(PolicyState::TokenBucket {
                level: 40_000,
                updated_ms: 0
            })
        );
    }
}
