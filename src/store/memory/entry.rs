//! One tracked caller: its key, kept once and inline when short, and its counters' states,
//! the first inline and any others beside it. A sliding log's state has no fixed size: it
//! sits beside the others, never inline, so that the fixed states stay as small as they are.

use std::sync::Mutex;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};

use crate::store::algorithm::{
    AdmissionLog, OutcomeWords, Packing, PolicyOutcome, State, WordDecision, WordUnits,
};
use crate::store::inline_bytes::InlineBytes;
use crate::store::policy::Policy;

/// Keys up to this many encoded bytes live inside the entry; longer ones (up to a tag and
/// [`MAX_KEY_BYTES`](crate::store::CallerKey::MAX_KEY_BYTES)) take one heap block. 22 keeps the key
/// as small as the boxed form it replaces.
const INLINE_KEY_BYTES: usize = 22;

/// A caller's encoded key, as the shard stores it.
type StoredKey = InlineBytes<INLINE_KEY_BYTES>;

/// A counter's state, read and written through a shared reference. Unpacked, the entry's
/// lock makes a decision's reads and writes one step and the atomics, all relaxed, only let
/// safe code write through `&`. Packed (see [`Packing`]), `a` holds the whole state and `b`
/// and `c` how it is packed, so a decision reads and writes `a` with one compare-and-swap.
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
/// A sliding window's state packed in `a`.
const PACKED_WINDOW: u8 = 4;
/// A token bucket's state packed in `a`.
const PACKED_BUCKET: u8 = 5;

impl SharedState {
    fn new(state: State) -> Self {
        let shared = Self {
            kind: AtomicU8::new(0),
            a: AtomicU64::new(0),
            b: AtomicU64::new(0),
            c: AtomicU64::new(0),
        };
        shared.store(state);
        shared
    }

    /// A state packed as `packing` says, if it fits; unpacked otherwise.
    fn packed(state: State, packing: Option<Packing>) -> Self {
        let Some((packing, word)) =
            packing.and_then(|packing| Some((packing, packing.encode(&state)?)))
        else {
            return Self::new(state);
        };
        let words = packing.to_words();
        Self {
            kind: AtomicU8::new(if words.window {
                PACKED_WINDOW
            } else {
                PACKED_BUCKET
            }),
            a: AtomicU64::new(word),
            b: AtomicU64::new(words.first),
            c: AtomicU64::new(words.second),
        }
    }

    /// How the state is packed, if it is.
    fn packing(&self) -> Option<Packing> {
        let window = match self.kind.load(Relaxed) {
            PACKED_WINDOW => true,
            PACKED_BUCKET => false,
            _ => return None,
        };
        Some(Packing::from_words(
            window,
            self.b.load(Relaxed),
            self.c.load(Relaxed),
        ))
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

    fn load(&self) -> State {
        if let Some(packing) = self.packing() {
            return packing.decode(self.a.load(Relaxed));
        }
        let (a, b) = (self.a.load(Relaxed), self.b.load(Relaxed));
        match self.kind.load(Relaxed) {
            TOKEN_BUCKET => State::TokenBucket {
                level: a,
                updated_ms: b,
            },
            _ => State::SlidingWindow {
                window_start: a,
                previous: b,
                current: self.c.load(Relaxed),
            },
        }
    }

    /// Writes `state`: packed if the slot is and it fits, otherwise unpacked (the slot then
    /// stays so). Under the entry's lock, where no compare-and-swap runs beside it (see
    /// [`Entry::decide_packed`]).
    fn store(&self, state: State) {
        if let Some(packing) = self.packing()
            && let Some(word) = packing.encode(&state)
        {
            self.a.store(word, Relaxed);
            return;
        }
        match state {
            State::SlidingWindow {
                window_start,
                previous,
                current,
            } => {
                self.kind.store(SLIDING_WINDOW, Relaxed);
                self.a.store(window_start, Relaxed);
                self.b.store(previous, Relaxed);
                self.c.store(current, Relaxed);
            }
            State::TokenBucket { level, updated_ms } => {
                self.kind.store(TOKEN_BUCKET, Relaxed);
                self.a.store(level, Relaxed);
                self.b.store(updated_ms, Relaxed);
            }
            // Never here: a log's counter has a log slot (its counter id names its unit).
            State::SlidingLog(_) => {}
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
    state: SlotState,
}

/// A state of a fixed size, or a sliding log's. The log's lock is never contended: the
/// entry's lock is held around it. It only lets safe code write through `&`.
enum SlotState {
    Fixed(SharedState),
    Log(Mutex<AdmissionLog>),
}

impl SlotState {
    fn new(state: State) -> Self {
        match state {
            State::SlidingLog(log) => SlotState::Log(Mutex::new(log)),
            fixed => SlotState::Fixed(SharedState::new(fixed)),
        }
    }

    fn as_ref(&self) -> StateRef<'_> {
        match self {
            SlotState::Fixed(shared) => StateRef::Fixed(shared),
            SlotState::Log(log) => StateRef::Log(log),
        }
    }
}

#[derive(Clone, Copy)]
enum StateRef<'a> {
    Fixed(&'a SharedState),
    Log(&'a Mutex<AdmissionLog>),
}

impl StateRef<'_> {
    fn load(self) -> State {
        match self {
            StateRef::Fixed(shared) => shared.load(),
            StateRef::Log(log) => State::SlidingLog(lock_log(log).clone()),
        }
    }

    fn store(self, state: State) {
        match (self, state) {
            (StateRef::Log(log), State::SlidingLog(next)) => *lock_log(log) = next,
            (StateRef::Fixed(shared), state) => shared.store(state),
            // Never: a counter keeps its kind (its id names its unit).
            (StateRef::Log(_), _) => {}
        }
    }
}

/// A panic while the log was locked left a whole log behind (every write is one
/// assignment), so a poisoned lock is still safe to use.
fn lock_log(log: &Mutex<AdmissionLog>) -> std::sync::MutexGuard<'_, AdmissionLog> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The first counter of an entry whose first state is a log, kept beside: no counter.
const NO_COUNTER: u32 = u32::MAX;

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

/// What a decision by compare-and-swap came to: admitted or refused with what the policy
/// reports, or [not packed](Self::NOT_PACKED) (the entry's lock decides), or [does not
/// fit](Self::DOES_NOT_FIT) (the shard's write lock decides, and unpacks the slot: never
/// under the entry's lock, beside a compare-and-swap).
///
/// Two words, so that it is returned in registers: returned through memory, it was written
/// a field at a time and read back sixteen bytes at a time, a load that waits for the
/// stores on every decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PackedDecision(OutcomeWords);

impl PackedDecision {
    /// The longest wait kept, below both markers.
    const LONGEST_WAIT_MS: u64 = OutcomeWords::LONGEST_WAIT_MS - 2;
    /// The counter is not packed, or not the entry's only one.
    pub(super) const NOT_PACKED: Self = Self(OutcomeWords::marker(OutcomeWords::LONGEST_WAIT_MS));
    /// The state to write does not fit its packing.
    pub(super) const DOES_NOT_FIT: Self =
        Self(OutcomeWords::marker(OutcomeWords::LONGEST_WAIT_MS - 1));

    #[inline]
    pub(super) fn decided(outcome: PolicyOutcome) -> Self {
        Self(OutcomeWords::of(outcome, Self::LONGEST_WAIT_MS))
    }

    /// What the policy reports, when the word decided.
    #[inline]
    pub(super) fn outcome(self) -> Option<PolicyOutcome> {
        if self == Self::NOT_PACKED || self == Self::DOES_NOT_FIT {
            return None;
        }
        Some(self.0.get())
    }
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
    /// A caller's first entry, holding one counter's state, packed as `packing` says when
    /// it fits.
    pub(super) fn new(key: &[u8], counter: u32, state: State, packing: Option<Packing>) -> Self {
        let (first_counter, first_state, more) = match state {
            State::SlidingLog(_) => (
                NO_COUNTER,
                SharedState::new(State::TokenBucket {
                    level: 0,
                    updated_ms: 0,
                }),
                Some(Box::new(vec![Slot {
                    counter,
                    state: SlotState::new(state),
                }])),
            ),
            fixed => (counter, SharedState::packed(fixed, packing), None),
        };
        Self {
            key: StoredKey::new(key),
            idle_at_ms: AtomicU64::new(0),
            first_state,
            more,
            first_counter,
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

    /// Decides a request of `cost` units against `algorithm` for the counter `counter`, by a
    /// compare-and-swap on its packed state, without the entry's lock, when the counter is
    /// the entry's only one and packed.
    ///
    /// Only a compare-and-swap writes such a slot through a shared reference: the entry's
    /// lock is taken for an entry with more than one counter, and a second counter is
    /// added under the shard's write lock, which no decision holding the read lock meets.
    pub(super) fn decide_packed(
        &self,
        counter: u32,
        limit: &Policy,
        now_ms: u64,
        cost: u64,
    ) -> PackedDecision {
        let packing = match self.first_state.packing() {
            Some(packing) if self.first_counter == counter && self.more.is_none() => packing,
            _ => return PackedDecision::NOT_PACKED,
        };
        // One loop for each algorithm, each with its own arithmetic inlined.
        match limit.word_units() {
            Some(WordUnits::Bucket(bucket)) => {
                self.decide_word_by(|word| packing.decide_bucket(word, bucket, now_ms, cost))
            }
            Some(WordUnits::Window(window)) => {
                self.decide_word_by(|word| packing.decide_window(word, window, now_ms, cost))
            }
            // A policy whose states do not pack: the general path unpacks the slot.
            None => PackedDecision::DOES_NOT_FIT,
        }
    }

    /// The compare-and-swap loop on the first state's packed word, each turn decided by
    /// `decide`.
    #[inline(always)]
    fn decide_word_by(&self, decide: impl Fn(u64) -> Option<WordDecision>) -> PackedDecision {
        let word = &self.first_state.a;
        let mut current = word.load(Relaxed);
        loop {
            let (outcome, next) = match decide(current) {
                Some(WordDecision::Admitted(outcome, next)) => (outcome, next),
                Some(WordDecision::Refused(outcome)) => return PackedDecision::decided(outcome),
                // A state that no longer fits, or one of another algorithm or packed in
                // other terms: the general path starts it afresh or unpacks it.
                Some(WordDecision::DoesNotFit) | None => return PackedDecision::DOES_NOT_FIT,
            };
            match word.compare_exchange_weak(current, next, Relaxed, Relaxed) {
                Ok(_) => return PackedDecision::decided(outcome),
                Err(actual) => current = actual,
            }
        }
    }

    fn slot(&self, counter: u32) -> Option<StateRef<'_>> {
        if self.first_counter == counter {
            return Some(StateRef::Fixed(&self.first_state));
        }
        self.more
            .as_ref()?
            .iter()
            .find(|slot| slot.counter == counter)
            .map(|slot| slot.state.as_ref())
    }

    /// Whether the entry holds a state for `counter`.
    pub(super) fn has(&self, counter: u32) -> bool {
        self.slot(counter).is_some()
    }

    pub(super) fn state(&self, counter: u32) -> Option<State> {
        self.slot(counter).map(StateRef::load)
    }

    /// Writes the state of a counter the entry holds (see [`has`](Self::has)); under the
    /// entry's lock.
    pub(super) fn update(&self, counter: u32, state: State) {
        if let Some(slot) = self.slot(counter) {
            slot.store(state);
        }
    }

    /// Writes a counter's state, adding the counter if the entry does not hold it yet.
    pub(super) fn store(&mut self, counter: u32, state: State) {
        let log = matches!(state, State::SlidingLog(_));
        if self.first_counter == counter {
            if !log {
                self.first_state.store(state);
                return;
            }
            // A log never sits inline: the counter moves beside.
            self.first_counter = NO_COUNTER;
        } else if let Some(slot) = self
            .more
            .as_mut()
            .and_then(|more| more.iter_mut().find(|slot| slot.counter == counter))
        {
            match (&slot.state, state) {
                (SlotState::Fixed(shared), fixed @ State::SlidingWindow { .. })
                | (SlotState::Fixed(shared), fixed @ State::TokenBucket { .. }) => {
                    shared.store(fixed);
                }
                (_, state) => slot.state = SlotState::new(state),
            }
            return;
        }
        self.more.get_or_insert_with(Default::default).push(Slot {
            counter,
            state: SlotState::new(state),
        });
    }

    /// The fixed state kept under `counter` (a block's slot is one), if any.
    fn fixed(&self, counter: u32) -> Option<&SharedState> {
        match self.slot(counter)? {
            StateRef::Fixed(shared) => Some(shared),
            StateRef::Log(_) => None,
        }
    }

    /// The block kept under `counter`, if the entry has a slot for it.
    pub(super) fn block(&self, counter: u32) -> Option<Block> {
        self.fixed(counter).and_then(SharedState::load_block)
    }

    /// Writes the block of a slot the entry holds; under the entry's lock.
    pub(super) fn update_block(&self, counter: u32, block: Block) {
        if let Some(slot) = self.fixed(counter) {
            slot.store_block(block);
        }
    }

    /// Writes a block, adding its slot if the entry has none yet.
    pub(super) fn store_block(&mut self, counter: u32, block: Block) {
        if let Some(slot) = self.fixed(counter) {
            slot.store_block(block);
            return;
        }
        let state = SharedState::block();
        state.store_block(block);
        self.more.get_or_insert_with(Default::default).push(Slot {
            counter,
            state: SlotState::Fixed(state),
        });
    }

    pub(super) fn idle_at_ms(&self) -> u64 {
        self.idle_at_ms.load(Relaxed)
    }

    /// Whether the entry's counters no longer affect a decision at `now_ms`: the caller is
    /// decided as one never seen (swept or not yet), so a caller seeded from elsewhere
    /// starts from the seed, not from a state that has long run out.
    pub(super) fn is_idle(&self, now_ms: u64) -> bool {
        self.idle_at_ms() <= now_ms
    }

    /// Keeps the entry until `idle_at_ms` at least. Decisions that take no lock race here:
    /// the later time always wins, so no caller is swept while its counters still matter.
    pub(super) fn keep_until(&self, idle_at_ms: u64) {
        self.keep_until_about(idle_at_ms, 0);
    }

    /// Keeps the entry until `idle_at_ms` at least, and at most `slack_ms` (a power of two
    /// less one) longer: the time is rounded up to the end of its `slack_ms + 1` block, so
    /// a caller that keeps coming back writes it once a block, not on each decision.
    #[inline]
    pub(super) fn keep_until_about(&self, idle_at_ms: u64, slack_ms: u64) {
        if idle_at_ms > self.idle_at_ms.load(Relaxed) {
            self.idle_at_ms.fetch_max(idle_at_ms | slack_ms, Relaxed);
        }
    }

    /// Marks the caller as seen since the eviction hand last passed.
    pub(super) fn mark_referenced(&self) {
        // Read first: a caller seen again leaves the line unwritten, and shared.
        if !self.referenced.load(Relaxed) {
            self.referenced.store(true, Relaxed);
        }
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
    fn a_packed_decision_keeps_its_outcome_apart_from_the_markers() {
        let waits = [
            0,
            1,
            999,
            PackedDecision::LONGEST_WAIT_MS,
            u64::MAX >> 1,
            u64::MAX,
        ];
        for admitted in [false, true] {
            for remaining in [0, 7, u64::MAX] {
                for reset_ms in waits {
                    let outcome = PolicyOutcome {
                        admitted,
                        remaining,
                        reset_ms,
                    };
                    let kept = PackedDecision::decided(outcome).outcome();
                    // Waits past the longest kept (millions of years) are kept as it.
                    let expected = PolicyOutcome {
                        reset_ms: reset_ms.min(PackedDecision::LONGEST_WAIT_MS),
                        ..outcome
                    };
                    assert_eq!(kept, Some(expected), "{outcome:?}");
                }
            }
        }
        assert_eq!(PackedDecision::NOT_PACKED.outcome(), None);
        assert_eq!(PackedDecision::DOES_NOT_FIT.outcome(), None);
        assert_ne!(PackedDecision::NOT_PACKED, PackedDecision::DOES_NOT_FIT);
        // Returned in two registers.
        assert_eq!(size_of::<PackedDecision>(), 16);
    }

    #[test]
    fn counters_are_kept_apart() {
        let window = |current| State::SlidingWindow {
            window_start: 0,
            previous: 0,
            current,
        };
        let mut entry = Entry::new(b"=acme", 3, window(1), None);
        assert_eq!(entry.state(3), Some(window(1)));
        assert_eq!(entry.state(0), None);
        entry.store(0, window(7));
        entry.store(3, window(2));
        assert_eq!(entry.state(0), Some(window(7)));
        assert_eq!(entry.state(3), Some(window(2)));
        let bucket = State::TokenBucket {
            level: u64::MAX - 1,
            updated_ms: 1_700_000_000_000,
        };
        let _held = entry.lock();
        assert!(entry.has(0) && !entry.has(5));
        entry.update(0, bucket.clone());
        entry.update(5, bucket.clone());
        assert_eq!(entry.state(0), Some(bucket));
        assert_eq!(entry.state(5), None);
    }

    #[test]
    fn a_log_sits_beside_the_fixed_states() {
        let log =
            |times: &[u64]| State::SlidingLog(AdmissionLog::from_times(times.iter().copied()));
        let window = State::SlidingWindow {
            window_start: 0,
            previous: 0,
            current: 4,
        };
        // A caller whose first counter is a log.
        let mut entry = Entry::new(b"=acme", 2, log(&[1, 2]), None);
        assert_eq!(entry.state(2), Some(log(&[1, 2])));
        assert_eq!(entry.state(0), None);
        entry.store(0, window.clone());
        {
            let _held = entry.lock();
            entry.update(2, log(&[2, 3, 4]));
        }
        assert_eq!(entry.state(2), Some(log(&[2, 3, 4])));
        assert_eq!(entry.state(0), Some(window.clone()));
        // A fixed first counter, then a log.
        let mut entry = Entry::new(b"=acme", 0, window.clone(), None);
        entry.store(1, log(&[9]));
        entry.store(1, log(&[9, 10]));
        assert_eq!(entry.state(1), Some(log(&[9, 10])));
        assert_eq!(entry.state(0), Some(window));
    }

    /// Every tracked caller pays for the entry; a log's slot only callers with a log.
    #[test]
    fn a_log_leaves_the_entry_its_size() {
        assert_eq!(size_of::<Entry>(), 80);
        assert_eq!(size_of::<Slot>(), 48);
    }

    #[test]
    fn the_lock_serializes_decisions_across_threads() {
        let entry = Entry::new(
            b"=acme",
            0,
            State::TokenBucket {
                level: 0,
                updated_ms: 0,
            },
            None,
        );
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10_000 {
                        let _held = entry.lock();
                        let Some(State::TokenBucket { level, updated_ms }) = entry.state(0) else {
                            unreachable!("a token bucket was stored");
                        };
                        entry.update(
                            0,
                            State::TokenBucket {
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
            Some(State::TokenBucket {
                level: 40_000,
                updated_ms: 0
            })
        );
    }
}
