//! One tracked caller, in one cache line: its key, kept once and inline when short, and its
//! counters' states: one packed in a word inside the entry while it is the caller's only
//! one, any other beside it (a sliding log's, a block's, a second counter's, a state too
//! large for its word).

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

/// A counter's state kept beside the entry's packed one, read and written through a
/// shared reference: the entry's lock makes a decision's reads and writes one step, and
/// the atomics, all relaxed, only let safe code write through `&`.
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

    fn store(&self, state: State) {
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
    /// The entry's packed state.
    Packed(&'a Entry, Packing),
    Fixed(&'a SharedState),
    Log(&'a Mutex<AdmissionLog>),
}

impl StateRef<'_> {
    fn load(self) -> State {
        match self {
            StateRef::Packed(entry, packing) => packing.decode(entry.word.load(Relaxed)),
            StateRef::Fixed(shared) => shared.load(),
            StateRef::Log(log) => State::SlidingLog(lock_log(log).clone()),
        }
    }
}

/// A panic while the log was locked left a whole log behind (every write is one
/// assignment), so a poisoned lock is still safe to use.
fn lock_log(log: &Mutex<AdmissionLog>) -> std::sync::MutexGuard<'_, AdmissionLog> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The entry's small fields, in one word: how its packed state is packed and under which
/// counter, and its mark for the eviction hand.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Head(u64);

impl Head {
    /// The packing's first word (a window's length or a bucket's unit), in the low half.
    const FIRST_BITS: u32 = 32;
    const COUNTER_SHIFT: u32 = 32;
    const COUNTER_BITS: u32 = 27;
    /// No packed state: every counter is kept beside.
    const NO_COUNTER: u32 = (1 << Self::COUNTER_BITS) - 1;
    /// The packed state is a sliding window's (a token bucket's otherwise).
    const WINDOW: u64 = 1 << 59;
    /// Seen since the eviction hand last passed, refused requests included.
    const REFERENCED: u64 = 1 << 62;

    const UNPACKED: Self = Self((Self::NO_COUNTER as u64) << Self::COUNTER_SHIFT);

    /// The head of an entry whose state for `counter` is packed as `packing` says, if its
    /// fields fit theirs (a counter past the 134 millionth of a shard, or a bucket's unit
    /// of 2^32 or more, is kept beside).
    fn packed(counter: u32, packing: Packing) -> Option<Self> {
        let words = packing.to_words();
        if counter >= Self::NO_COUNTER || words.first >> Self::FIRST_BITS != 0 {
            return None;
        }
        let window = if words.window { Self::WINDOW } else { 0 };
        Some(Self(
            words.first | u64::from(counter) << Self::COUNTER_SHIFT | window,
        ))
    }

    /// The counter whose state is packed, if one is.
    #[inline]
    fn counter(self) -> Option<u32> {
        let counter = (self.0 >> Self::COUNTER_SHIFT) as u32 & Self::NO_COUNTER;
        (counter != Self::NO_COUNTER).then_some(counter)
    }

    #[inline]
    fn packing(self, second: u64) -> Packing {
        Packing::from_words(
            self.0 & Self::WINDOW != 0,
            self.0 & ((1 << Self::FIRST_BITS) - 1),
            second,
        )
    }

    /// The same head, its state no longer packed; the mark kept.
    fn unpacked(self) -> Self {
        Self(Self::UNPACKED.0 | self.0 & Self::REFERENCED)
    }
}

/// A tracked caller, in one cache line. Counters are named by their index in the shard's
/// counter list, so an entry holds no name. Most limiters apply one policy whose states
/// pack in a word: that state is the entry's own (`word`, packed as `head` and `second`
/// say), decided by compare-and-swap while it is the caller's only counter. Any other
/// state (a second counter, a block, a log, a state that does not pack) is kept beside.
///
/// A decision on a tracked caller runs under the shard's read lock, and for states kept
/// beside under this entry's own lock, so decisions for other callers of the shard go on
/// beside it; adding a caller or a counter, evicting and sweeping take the shard's write
/// lock.
#[repr(align(64))]
pub(super) struct Entry {
    key: StoredKey,
    /// After this instant the entry's counters affect no decision.
    idle_at_ms: AtomicU64,
    /// The packed state, if `head` names its counter.
    word: AtomicU64,
    /// The packing's second word (its base and bit count).
    second: AtomicU64,
    /// See [`Head`].
    head: AtomicU64,
    /// The states kept beside: one pointer, which every tracked caller pays for.
    beside: Option<Box<Beside>>,
}

/// The states an entry keeps beside its packed one, the first inline: a caller whose one
/// state does not pack reaches it through one pointer, in one allocation.
struct Beside {
    /// Held by the decision reading and writing these states through a shared reference.
    busy: AtomicBool,
    first: Slot,
    /// In the order of their counters, so that an entry with many (a nested budget's, a
    /// state for each member) finds one by a binary search.
    rest: Vec<Slot>,
}

impl Beside {
    /// The slot of `counter`, if any.
    fn get(&self, counter: u32) -> Option<&Slot> {
        if self.first.counter == counter {
            return Some(&self.first);
        }
        self.rest.get(self.in_rest(counter)?)
    }

    /// [`get`](Self::get), to write.
    fn get_mut(&mut self, counter: u32) -> Option<&mut Slot> {
        if self.first.counter == counter {
            return Some(&mut self.first);
        }
        let i = self.in_rest(counter)?;
        self.rest.get_mut(i)
    }

    /// Where the slot of `counter` is among the rest, if it is.
    fn in_rest(&self, counter: u32) -> Option<usize> {
        self.rest
            .binary_search_by_key(&counter, |slot| slot.counter)
            .ok()
    }

    /// Adds the slot of a counter the entry has none for, in its place. A shard numbers
    /// counters as it meets them, so a new member's usually goes last.
    fn add(&mut self, slot: Slot) {
        let at = self
            .rest
            .partition_point(|kept| kept.counter < slot.counter);
        self.rest.insert(at, slot);
    }
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

/// An entry's lock, held; released when dropped (on unwinding too). An entry with no
/// states beside has nothing to hold: its packed state is one word.
pub(super) struct EntryGuard<'a> {
    busy: Option<&'a AtomicBool>,
}

impl Drop for EntryGuard<'_> {
    fn drop(&mut self) {
        if let Some(busy) = self.busy {
            busy.store(false, Release);
        }
    }
}

impl Entry {
    /// A caller's first entry, holding one counter's state, packed as `packing` says when
    /// it fits.
    pub(super) fn new(key: &[u8], counter: u32, state: State, packing: Option<Packing>) -> Self {
        let mut entry = Self {
            key: StoredKey::new(key),
            idle_at_ms: AtomicU64::new(0),
            word: AtomicU64::new(0),
            second: AtomicU64::new(0),
            head: AtomicU64::new(Head::UNPACKED.0),
            beside: None,
        };
        let packed = packing.and_then(|packing| {
            Some((
                Head::packed(counter, packing)?,
                packing.encode(&state)?,
                packing,
            ))
        });
        match packed {
            Some((head, word, packing)) => {
                entry.head = AtomicU64::new(head.0);
                entry.word = AtomicU64::new(word);
                entry.second = AtomicU64::new(packing.to_words().second);
            }
            None => {
                entry.add_beside(Slot {
                    counter,
                    state: SlotState::new(state),
                });
            }
        }
        entry
    }

    pub(super) fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    #[inline]
    fn head(&self) -> Head {
        Head(self.head.load(Relaxed))
    }

    /// How the packed state named by `head` is packed.
    #[inline]
    fn packing(&self, head: Head) -> Packing {
        head.packing(self.second.load(Relaxed))
    }

    /// Whether the caller's only state is packed, decided by compare-and-swap alone: never
    /// under the entry's lock (see [`update`](Self::update)).
    pub(super) fn is_packed(&self) -> bool {
        self.head().counter().is_some()
    }

    /// Takes the entry's lock, for a decision through a shared reference. (States beside
    /// are added under the shard's write lock, so none appear while a guard is held.)
    pub(super) fn lock(&self) -> EntryGuard<'_> {
        let Some(beside) = &self.beside else {
            return EntryGuard { busy: None };
        };
        let busy = &beside.busy;
        let mut spins = 0;
        while busy
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            while busy.load(Relaxed) {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        EntryGuard { busy: Some(busy) }
    }

    /// Decides a request of `cost` units against `algorithm` for the counter `counter`, by a
    /// compare-and-swap on its packed state, without the entry's lock, when the counter is
    /// the entry's only one and packed. With the decision, when `counted_from` asks for it
    /// and the request was admitted, the time the state written counts from
    /// ([`Packing::counted_from_ms`]; 0 otherwise): read from the word before it is
    /// written, not loaded again after the compare-and-swap, which would wait for it.
    ///
    /// Only a compare-and-swap writes the packed state through a shared reference: a
    /// second counter is added, and a state that does not fit is unpacked, under the
    /// shard's write lock, which no decision holding the read lock meets.
    #[inline]
    pub(super) fn decide_packed(
        &self,
        counter: u32,
        limit: &Policy,
        now_ms: u64,
        cost: u64,
        counted_from: bool,
    ) -> (PackedDecision, u64) {
        let head = self.head();
        if head.counter() != Some(counter) {
            return (PackedDecision::NOT_PACKED, 0);
        }
        let packing = self.packing(head);
        let written = |word| {
            if counted_from {
                packing.counted_from_ms(word)
            } else {
                0
            }
        };
        // One loop for each algorithm, each with its own arithmetic inlined.
        match limit.word_units() {
            Some(WordUnits::Bucket(bucket)) => self.decide_word_by(
                |word| packing.decide_bucket(word, bucket, now_ms, cost),
                written,
            ),
            Some(WordUnits::Window(window)) => self.decide_word_by(
                |word| packing.decide_window(word, window, now_ms, cost),
                written,
            ),
            // A policy whose states do not pack: the general path unpacks the state.
            None => (PackedDecision::DOES_NOT_FIT, 0),
        }
    }

    /// The compare-and-swap loop on the packed word, each turn decided by `decide`: the
    /// decision, and what `written` makes of the word written (0 when none is).
    #[inline(always)]
    fn decide_word_by(
        &self,
        decide: impl Fn(u64) -> Option<WordDecision>,
        written: impl Fn(u64) -> u64,
    ) -> (PackedDecision, u64) {
        let word = &self.word;
        let mut current = word.load(Relaxed);
        loop {
            let (outcome, next) = match decide(current) {
                Some(WordDecision::Admitted(outcome, next)) => (outcome, next),
                Some(WordDecision::Refused(outcome)) => {
                    return (PackedDecision::decided(outcome), 0);
                }
                // A state that no longer fits, or one of another algorithm or packed in
                // other terms: the general path starts it afresh or unpacks it.
                Some(WordDecision::DoesNotFit) | None => {
                    return (PackedDecision::DOES_NOT_FIT, 0);
                }
            };
            match word.compare_exchange_weak(current, next, Relaxed, Relaxed) {
                Ok(_) => return (PackedDecision::decided(outcome), written(next)),
                Err(actual) => current = actual,
            }
        }
    }

    fn slot(&self, counter: u32) -> Option<StateRef<'_>> {
        let head = self.head();
        if head.counter() == Some(counter) {
            return Some(StateRef::Packed(self, self.packing(head)));
        }
        self.beside(counter).map(SlotState::as_ref)
    }

    /// A state kept beside the packed one.
    fn beside(&self, counter: u32) -> Option<&SlotState> {
        self.beside.as_ref()?.get(counter).map(|slot| &slot.state)
    }

    /// Whether the entry holds a state for `counter`.
    pub(super) fn has(&self, counter: u32) -> bool {
        self.slot(counter).is_some()
    }

    pub(super) fn state(&self, counter: u32) -> Option<State> {
        self.slot(counter).map(StateRef::load)
    }

    /// Writes the state of a counter the entry keeps beside (see [`has`](Self::has));
    /// under the entry's lock. A packed state is not written here: it may not fit, and
    /// only the shard's write lock may unpack it ([`store`](Self::store)).
    pub(super) fn update(&self, counter: u32, state: State) {
        debug_assert!(
            !self.is_packed(),
            "a packed state is written by the write lock"
        );
        match (self.beside(counter), state) {
            (Some(SlotState::Log(log)), State::SlidingLog(next)) => *lock_log(log) = next,
            (Some(SlotState::Fixed(shared)), state) => shared.store(state),
            // Never: a counter keeps its kind (its id names its unit).
            _ => {}
        }
    }

    /// Writes a counter's state, adding the counter if the entry does not hold it yet.
    pub(super) fn store(&mut self, counter: u32, state: State) {
        let head = self.head();
        if head.counter() == Some(counter) {
            if let Some(word) = self.packing(head).encode(&state) {
                *self.word.get_mut() = word;
                return;
            }
            // It no longer fits: kept beside from now on, as any other.
            *self.head.get_mut() = head.unpacked().0;
            self.add_beside(Slot {
                counter,
                state: SlotState::new(state),
            });
            return;
        }
        if let Some(slot) = self
            .beside
            .as_mut()
            .and_then(|beside| beside.get_mut(counter))
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
        self.unpack();
        self.add_beside(Slot {
            counter,
            state: SlotState::new(state),
        });
    }

    /// Moves the packed state beside when it is `counter`'s and `limit` (that counter's
    /// policy) does not decide it by its word: after a limits swap to a policy whose
    /// states do not pack, or pack in other terms (a bucket's new rate), its caller is
    /// decided under its own lock, where each decision would otherwise come back to the
    /// shard's write lock.
    pub(super) fn unpack_unless_decided_by(&mut self, counter: u32, limit: &Policy) {
        let head = self.head();
        if head.counter() == Some(counter) && !self.packing(head).decides_in(limit.word_units()) {
            self.unpack();
        }
    }

    /// Moves the packed state, if any, beside: a caller with two counters is decided under
    /// its lock.
    fn unpack(&mut self) {
        let head = self.head();
        if let Some(counter) = head.counter() {
            let state = self.packing(head).decode(*self.word.get_mut());
            *self.head.get_mut() = head.unpacked().0;
            self.add_beside(Slot {
                counter,
                state: SlotState::new(state),
            });
        }
    }

    fn add_beside(&mut self, slot: Slot) {
        match &mut self.beside {
            Some(beside) => beside.add(slot),
            None => {
                self.beside = Some(Box::new(Beside {
                    busy: AtomicBool::new(false),
                    first: slot,
                    rest: Vec::new(),
                }));
            }
        }
    }

    /// The fixed state kept under `counter` (a block's slot is one), if any.
    fn fixed(&self, counter: u32) -> Option<&SharedState> {
        match self.beside(counter)? {
            SlotState::Fixed(shared) => Some(shared),
            SlotState::Log(_) => None,
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
        self.unpack();
        self.add_beside(Slot {
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
    #[inline]
    pub(super) fn mark_referenced(&self) {
        // Read first: a caller seen again leaves the line unwritten, and shared.
        if self.head.load(Relaxed) & Head::REFERENCED == 0 {
            self.head.fetch_or(Head::REFERENCED, Relaxed);
        }
    }

    /// Whether the caller was seen since the hand last passed; clears the mark.
    pub(super) fn take_referenced(&mut self) -> bool {
        let head = self.head.get_mut();
        let referenced = *head & Head::REFERENCED != 0;
        *head &= !Head::REFERENCED;
        referenced
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::algorithm::Algorithm;

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
    fn many_counters_are_found_whatever_order_they_came_in() {
        let window = |current| State::SlidingWindow {
            window_start: 0,
            previous: 0,
            current,
        };
        // A team's entry, a counter for each member, met in no particular order (a
        // member's counter may have been numbered by another team of the shard first).
        let counters: Vec<u32> = (0..2_000u32).map(|i| (i * 7_919) % 2_003).collect();
        let mut entry = Entry::new(b"=acme", counters[0], window(1), None);
        for &counter in &counters[1..] {
            entry.store(counter, window(u64::from(counter) + 1));
        }
        for &counter in &counters {
            let expected = if counter == counters[0] {
                1
            } else {
                u64::from(counter) + 1
            };
            assert_eq!(entry.state(counter), Some(window(expected)), "{counter}");
        }
        for missing in (0..2_003).filter(|c| !counters.contains(c)) {
            assert_eq!(entry.state(missing), None);
        }
        let _held = entry.lock();
        entry.update(counters[1_000], window(0));
        assert_eq!(entry.state(counters[1_000]), Some(window(0)));
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

    fn packed_window(counter: u32, current: u64) -> (Entry, Packing, State) {
        let now = 1_800_000_000_000;
        let algorithm = Algorithm::SlidingWindow {
            limit: 100,
            window_ms: 1_000,
        };
        let packing = Packing::of(&algorithm, now).expect("a small window packs");
        let state = State::SlidingWindow {
            window_start: now,
            previous: 3,
            current,
        };
        let entry = Entry::new(b"=acme", counter, state.clone(), Some(packing));
        (entry, packing, state)
    }

    #[test]
    fn a_packed_state_moves_beside_intact_when_it_stops_fitting_or_gets_company() {
        // A state too large for its packing is kept beside from then on.
        let (mut entry, _, state) = packed_window(4, 7);
        assert!(entry.is_packed());
        assert_eq!(entry.state(4), Some(state.clone()));
        let huge = State::SlidingWindow {
            window_start: 1_800_000_000_000,
            previous: 3,
            current: u64::MAX / 2,
        };
        entry.store(4, huge.clone());
        assert!(!entry.is_packed());
        assert_eq!(entry.state(4), Some(huge));

        // A second counter, or a block: the packed state joins them beside, unchanged, and
        // the caller's mark stays.
        for block in [false, true] {
            let (mut entry, _, state) = packed_window(4, 7);
            entry.mark_referenced();
            if block {
                entry.store_block(
                    9,
                    Block {
                        since_ms: 1,
                        until_ms: 2,
                    },
                );
                assert_eq!(entry.block(9).map(|b| b.until_ms), Some(2));
            } else {
                entry.store(9, state.clone());
                assert_eq!(entry.state(9), Some(state.clone()));
            }
            assert!(!entry.is_packed());
            assert_eq!(entry.state(4), Some(state.clone()));
            let _held = entry.lock();
            entry.update(4, state.clone());
            drop(_held);
            assert!(entry.take_referenced());
            assert!(!entry.take_referenced());
        }
    }

    #[test]
    fn a_packed_state_is_decided_by_its_word_and_keeps_its_marks_apart() {
        let (entry, packing, _) = packed_window(4, 7);
        let limit = Policy::sliding_window("per-second", crate::Quota::per_second(100));
        let now = 1_800_000_000_100;
        assert_eq!(
            entry.decide_packed(5, &limit, now, 1, true),
            (PackedDecision::NOT_PACKED, 0)
        );
        let (decided, counted_from_ms) = entry.decide_packed(4, &limit, now, 1, true);
        assert!(decided.outcome().is_some_and(|outcome| outcome.admitted));
        // The state written counts from the start of now's window; not asked, nothing.
        assert_eq!(counted_from_ms, now - now % 1_000);
        let (decided, counted_from_ms) = entry.decide_packed(4, &limit, now, 1, false);
        assert!(decided.outcome().is_some_and(|outcome| outcome.admitted));
        assert_eq!(counted_from_ms, 0);
        // The mark shares the head with the packing, which it leaves alone.
        entry.mark_referenced();
        drop(entry.lock());
        let head = entry.head();
        assert_ne!(head.0 & Head::REFERENCED, 0);
        assert_eq!(head.counter(), Some(4));
        assert_eq!(entry.packing(head), packing);
        match entry.state(4) {
            Some(State::SlidingWindow { current, .. }) => assert_eq!(current, 9),
            other => panic!("a window was stored: {other:?}"),
        }
    }

    #[test]
    fn what_the_head_cannot_hold_is_kept_beside() {
        let now = 1_800_000_000_000;
        let window = Algorithm::SlidingWindow {
            limit: 100,
            window_ms: 1_000,
        };
        let packing = Packing::of(&window, now).expect("packs");
        assert!(Head::packed(Head::NO_COUNTER, packing).is_none());
        assert!(Head::packed(Head::NO_COUNTER - 1, packing).is_some());
        // A bucket whose unit (the rate's and period's greatest common divisor) is 2^32.
        let unit = 1 << 32;
        let bucket = Algorithm::TokenBucket {
            rate: unit,
            period_ms: unit,
            burst: 1,
        };
        if let Some(packing) = Packing::of(&bucket, now) {
            assert!(Head::packed(0, packing).is_none());
            let state = State::TokenBucket {
                level: 0,
                updated_ms: now,
            };
            let entry = Entry::new(b"=acme", 0, state.clone(), Some(packing));
            assert!(!entry.is_packed());
            assert_eq!(entry.state(0), Some(state));
        }
    }

    /// Every tracked caller pays for the entry, one cache line; a log's slot only callers
    /// with a log.
    #[test]
    fn a_log_leaves_the_entry_its_size() {
        assert_eq!(size_of::<Entry>(), 64);
        assert_eq!(align_of::<Entry>(), 64);
        assert_eq!(size_of::<Beside>(), 80);
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
