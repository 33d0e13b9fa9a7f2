//! A counter's state in one 64-bit word, for the shapes that fit: arithmetic on the
//! algorithms' states, which the in-process store uses to decide a caller with one such
//! policy by one compare-and-swap of the word, taking no lock of its own.
//!
//! - A sliding window packs its window's index (counted from the slot's base window), the
//!   previous window's count and the current one's.
//! - A token bucket packs the time of its level (ms after the slot's base) and the level,
//!   in units of the greatest common divisor of its rate and period (every level the
//!   arithmetic writes is a multiple of it).
//!
//! Each packed slot covers at least 2^34 ms (about 199 days) from its base, which is set
//! when the slot is made. A state that does not fit (a count or level too large for its
//! bits, a time outside the span, a state of another algorithm) has no packed form
//! ([`Packing::encode`] answers `None`), and the store keeps it unpacked. Decoding is exact,
//! so both forms decide alike.
//!
//! A word is decided in its own terms ([`Packing::decide_bucket`],
//! [`Packing::decide_window`]), by the algorithms' arithmetic on a bucket's level in its
//! units and on a window's index, all in 64 bits: a window whose weighed counts would not
//! fit (2^32 ms or more) does not pack.

use super::sliding_window::{self, WindowUnits};
use super::token_bucket::{self, BucketUnits};
use super::{Algorithm, Numbers, PolicyOutcome, State, gcd};

/// The smallest span of time (log2 of milliseconds) a packed slot covers from its base.
const SPAN_BITS: u32 = 34;

/// How long before its creation a slot's base lies, so that a state a little in the past
/// (a clock that moved back, another instance's slightly slower clock) still fits.
const BASE_MARGIN_MS: u64 = 3_600_000;

/// How one slot's state is packed: fixed when the slot is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Packing {
    /// `index << 2c | previous << c | current`, with `c` bits per count.
    Window {
        window_ms: u64,
        count_bits: u32,
        /// The window index (start / window) the packed index counts from.
        base_index: u64,
    },
    /// `time << level_bits | level / unit`.
    Bucket {
        unit: u64,
        level_bits: u32,
        /// The time the packed time counts from.
        base_ms: u64,
    },
}

/// Packing's parameters as two words, kept beside the packed state.
pub(crate) struct PackingWords {
    pub(crate) window: bool,
    pub(crate) first: u64,
    pub(crate) second: u64,
}

/// Where the bit count sits in the second parameter word (bases stay below 2^58).
const BITS_SHIFT: u32 = 58;

impl Packing {
    /// The packing for `algorithm`'s states in a slot made at `now_ms`, if its states fit.
    pub(crate) fn of(algorithm: &Algorithm, now_ms: u64) -> Option<Self> {
        let base_ms = now_ms.saturating_sub(BASE_MARGIN_MS);
        match *algorithm {
            Algorithm::SlidingWindow { limit, window_ms } => {
                let index_bits = SPAN_BITS.saturating_sub(window_ms.checked_ilog2()?).max(1);
                let count_bits = (64 - index_bits) / 2;
                // The word is decided in 64-bit arithmetic, which must hold what its counts
                // weigh (windows shorter than 2^32 ms, about 50 days).
                (bits(limit) <= count_bits
                    && sliding_window::fits_in_64_bits(window_ms, count_bits))
                .then_some(Packing::Window {
                    window_ms,
                    count_bits,
                    base_index: base_ms / window_ms,
                })
            }
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => {
                let unit = gcd(rate, period_ms);
                let level_bits = 64 - SPAN_BITS;
                let capacity = u128::from(burst) * u128::from(period_ms) / u128::from(unit);
                (capacity < 1 << level_bits).then_some(Packing::Bucket {
                    unit,
                    level_bits,
                    base_ms,
                })
            }
            Algorithm::SlidingLog { .. } => None,
        }
    }

    /// The words [`from_words`](Self::from_words) reads back.
    pub(crate) fn to_words(self) -> PackingWords {
        match self {
            Packing::Window {
                window_ms,
                count_bits,
                base_index,
            } => PackingWords {
                window: true,
                first: window_ms,
                second: base_index | u64::from(count_bits) << BITS_SHIFT,
            },
            Packing::Bucket {
                unit,
                level_bits,
                base_ms,
            } => PackingWords {
                window: false,
                first: unit,
                second: base_ms | u64::from(level_bits) << BITS_SHIFT,
            },
        }
    }

    pub(crate) fn from_words(window: bool, first: u64, second: u64) -> Self {
        let bits = (second >> BITS_SHIFT) as u32;
        let base = second & ((1 << BITS_SHIFT) - 1);
        if window {
            Packing::Window {
                window_ms: first,
                count_bits: bits,
                base_index: base,
            }
        } else {
            Packing::Bucket {
                unit: first,
                level_bits: bits,
                base_ms: base,
            }
        }
    }

    /// Whether a word packed this way is decided in the terms of `units` (a policy's, when
    /// its states pack): a bucket of the same unit, or a window of the same length.
    pub(crate) fn decides_in(self, units: Option<&WordUnits>) -> bool {
        match (self, units) {
            (Packing::Bucket { unit, .. }, Some(WordUnits::Bucket(bucket))) => unit == bucket.unit,
            (Packing::Window { window_ms, .. }, Some(WordUnits::Window(window))) => {
                window_ms == window.window.get()
            }
            _ => false,
        }
    }

    /// `state` in one word, if it fits.
    pub(crate) fn encode(self, state: &State) -> Option<u64> {
        match (self, state) {
            (
                Packing::Window { .. },
                &State::SlidingWindow {
                    window_start,
                    previous,
                    current,
                },
            ) => self.encode_numbers([window_start, previous, current]),
            (Packing::Bucket { .. }, &State::TokenBucket { level, updated_ms }) => {
                self.encode_numbers([level, updated_ms, 0])
            }
            _ => None,
        }
    }

    /// A state given as [`Numbers`] of this packing's kind in one word, if it fits.
    fn encode_numbers(self, numbers: Numbers) -> Option<u64> {
        match self {
            Packing::Window {
                window_ms,
                count_bits,
                base_index,
            } => {
                let [window_start, previous, current] = numbers;
                let index = window_start / window_ms;
                if index * window_ms != window_start {
                    return None;
                }
                let relative = index.checked_sub(base_index)?;
                let limit = 1u64 << count_bits;
                (relative < 1 << (64 - 2 * count_bits) && previous < limit && current < limit)
                    .then_some(relative << (2 * count_bits) | previous << count_bits | current)
            }
            Packing::Bucket {
                unit,
                level_bits,
                base_ms,
            } => {
                let [level, updated_ms, _] = numbers;
                let relative = updated_ms.checked_sub(base_ms)?;
                let units = level / unit;
                (units * unit == level && units < 1 << level_bits && relative < 1 << SPAN_BITS)
                    .then_some(relative << level_bits | units)
            }
        }
    }

    /// The state a word holds.
    pub(crate) fn decode(self, word: u64) -> State {
        match self.decode_numbers(word) {
            [window_start, previous, current] if self.is_window() => State::SlidingWindow {
                window_start,
                previous,
                current,
            },
            [level, updated_ms, _] => State::TokenBucket { level, updated_ms },
        }
    }

    /// The time a word's state counts from: its window's start, or the time of its level.
    /// Its policy's retention after that, the state no longer weighs.
    pub(crate) fn counted_from_ms(self, word: u64) -> u64 {
        match self.decode_numbers(word) {
            [window_start, ..] if self.is_window() => window_start,
            [_, updated_ms, _] => updated_ms,
        }
    }

    /// The state a word holds, as [`Numbers`].
    fn decode_numbers(self, word: u64) -> Numbers {
        match self {
            Packing::Window {
                window_ms,
                count_bits,
                base_index,
            } => {
                let mask = (1u64 << count_bits) - 1;
                [
                    (base_index + (word >> (2 * count_bits))) * window_ms,
                    (word >> count_bits) & mask,
                    word & mask,
                ]
            }
            Packing::Bucket {
                unit,
                level_bits,
                base_ms,
            } => [
                (word & ((1u64 << level_bits) - 1)) * unit,
                base_ms + (word >> level_bits),
                0,
            ],
        }
    }

    /// Whether this packs a sliding window (a token bucket otherwise).
    pub(crate) fn is_window(self) -> bool {
        matches!(self, Packing::Window { .. })
    }
}

/// What [`Packing::decide_bucket`] and [`Packing::decide_window`] decide a packed word with,
/// fixed when its policy is made: the algorithm's numbers in the word's own terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WordUnits {
    Bucket(BucketUnits),
    Window(WindowUnits),
}

impl WordUnits {
    /// The numbers of `algorithm`'s packed states: `None` when its states do not pack.
    pub(crate) fn of(algorithm: &Algorithm) -> Option<Self> {
        match (*algorithm, Packing::of(algorithm, 0)?) {
            (
                Algorithm::TokenBucket {
                    rate,
                    period_ms,
                    burst,
                },
                Packing::Bucket { .. },
            ) => Some(WordUnits::Bucket(BucketUnits::new(rate, period_ms, burst))),
            (Algorithm::SlidingWindow { limit, window_ms }, Packing::Window { .. }) => {
                Some(WordUnits::Window(WindowUnits::new(limit, window_ms)))
            }
            _ => None,
        }
    }
}

/// What a decision on a packed word came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WordDecision {
    /// Refused: nothing to write.
    Refused(PolicyOutcome),
    /// Admitted: the word to write.
    Admitted(PolicyOutcome, u64),
    /// The state to write does not fit the word.
    DoesNotFit,
}

impl Packing {
    /// A request of `cost` units at `now_ms` decided on a token bucket's packed word, in
    /// the word's own terms (the level in the bucket's units): the decision, the state and
    /// the report of the arithmetic on the state the word holds, without converting it to
    /// that state and back. `None` when the word is not a bucket's packed in those units.
    #[inline]
    pub(crate) fn decide_bucket(
        self,
        word: u64,
        bucket: &BucketUnits,
        now_ms: u64,
        cost: u64,
    ) -> Option<WordDecision> {
        let Packing::Bucket {
            unit,
            level_bits,
            base_ms,
        } = self
        else {
            return None;
        };
        if unit != bucket.unit {
            return None;
        }
        let level_mask = (1u64 << level_bits) - 1;
        let stored = [word & level_mask, base_ms + (word >> level_bits)];
        let (outcome, [level, updated_ms]) =
            token_bucket::decide_in_units(bucket, stored, now_ms, cost);
        let relative = updated_ms - base_ms;
        Some(decided(
            outcome,
            relative < 1 << SPAN_BITS && level <= level_mask,
            relative << level_bits | level,
        ))
    }

    /// [`decide_bucket`](Self::decide_bucket) for a sliding window, the word's window
    /// taken by its index. `None` when the word is not a window's of the same length.
    #[inline]
    pub(crate) fn decide_window(
        self,
        word: u64,
        units: &WindowUnits,
        now_ms: u64,
        cost: u64,
    ) -> Option<WordDecision> {
        let Packing::Window {
            window_ms,
            count_bits,
            base_index,
        } = self
        else {
            return None;
        };
        if window_ms != units.window.get() {
            return None;
        }
        let count_mask = (1u64 << count_bits) - 1;
        let stored = [
            base_index + (word >> (2 * count_bits)),
            (word >> count_bits) & count_mask,
            word & count_mask,
        ];
        let (outcome, [index, previous, current]) =
            sliding_window::decide_by_index(units, stored, now_ms, cost);
        let relative = index - base_index;
        Some(decided(
            outcome,
            relative < 1 << (64 - 2 * count_bits) && current <= count_mask,
            relative << (2 * count_bits) | previous << count_bits | current,
        ))
    }
}

/// A word's decision: the word to write for an admission that fits.
#[inline]
fn decided(outcome: PolicyOutcome, fits: bool, word: u64) -> WordDecision {
    match (outcome.admitted, fits) {
        (false, _) => WordDecision::Refused(outcome),
        (true, true) => WordDecision::Admitted(outcome, word),
        (true, false) => WordDecision::DoesNotFit,
    }
}

/// How many bits `n` takes.
fn bits(n: u64) -> u32 {
    64 - n.leading_zeros()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn the_usual_shapes_pack() {
        let window = Algorithm::sliding_window(50, Duration::from_secs(1));
        let day = Algorithm::sliding_window(1_000_000, Duration::from_secs(86_400));
        let bucket = Algorithm::token_bucket(1_000_000_000, Duration::from_secs(1), 1_000_000_000);
        for algorithm in [window, day, bucket] {
            assert!(Packing::of(&algorithm, NOW).is_some(), "{algorithm:?}");
            assert!(WordUnits::of(&algorithm).is_some());
        }
        let huge = Algorithm::sliding_window(1 << 40, Duration::from_millis(1));
        assert!(Packing::of(&huge, NOW).is_none());
        let log = Algorithm::sliding_log(5, Duration::from_secs(1));
        assert!(Packing::of(&log, NOW).is_none());
        // A billion a second in a window of a second: 30 bits a count, where 19 are left.
        let billion = Algorithm::sliding_window(1_000_000_000, Duration::from_secs(1));
        for algorithm in [huge, log, billion] {
            assert!(WordUnits::of(&algorithm).is_none(), "{algorithm:?}");
        }
    }

    #[test]
    fn a_state_that_does_not_fit_is_not_packed() {
        let window = Algorithm::sliding_window(50, Duration::from_secs(1));
        let packing = Packing::of(&window, NOW).expect("packs");
        let early = State::SlidingWindow {
            window_start: 0,
            previous: 0,
            current: 1,
        };
        assert_eq!(packing.encode(&early), None);
        let unaligned = State::SlidingWindow {
            window_start: NOW + 1,
            previous: 0,
            current: 1,
        };
        assert_eq!(packing.encode(&unaligned), None);
        let bucket = State::TokenBucket {
            level: 0,
            updated_ms: NOW,
        };
        assert_eq!(packing.encode(&bucket), None);
    }

    fn algorithms() -> impl Strategy<Value = Algorithm> {
        prop_oneof![
            (1u64..2_000_000, 1u64..100_000_000).prop_filter_map("exact", |(limit, ms)| {
                Algorithm::try_sliding_window(limit, Duration::from_millis(ms)).ok()
            }),
            (1u64..2_000_000, 1u64..10_000_000, 1u64..2_000_000).prop_filter_map(
                "exact",
                |(rate, ms, burst)| {
                    Algorithm::try_token_bucket(rate, Duration::from_millis(ms), burst).ok()
                }
            ),
        ]
    }

    /// Token buckets whose rate and period share divisors (a unit above one), and some
    /// that do not; sliding windows from a millisecond to years.
    fn word_algorithms() -> impl Strategy<Value = Algorithm> {
        prop_oneof![
            (1u64..5_000, 1u64..100_000, 1u64..5_000, 1u64..50).prop_filter_map(
                "exact",
                |(rate, ms, burst, common)| {
                    let (rate, ms) = (rate * common, ms * common);
                    Algorithm::try_token_bucket(rate, Duration::from_millis(ms), burst).ok()
                }
            ),
            (prop_oneof![1u64..12, 1u64..2_000], 0u32..36, 1u64..1_000).prop_filter_map(
                "exact",
                |(limit, shift, ms)| {
                    let ms = (ms << shift).max(1);
                    Algorithm::try_sliding_window(limit, Duration::from_millis(ms)).ok()
                }
            ),
        ]
    }

    proptest! {
        /// A word decided in its own terms decides, writes and reports what the arithmetic
        /// on the state it holds does: clocks that move back, times before the slot's base
        /// or beyond its span, costs above the quota and states that no longer fit
        /// included.
        #[test]
        fn a_word_decided_in_its_own_terms_decides_as_its_state_does(
            algorithm in word_algorithms(),
            made_at in prop_oneof![Just(0u64), Just(NOW)],
            steps in prop::collection::vec((0u64..20_000, 0u64..8, 0u8..5), 1..60),
        ) {
            let Some(packing) = Packing::of(&algorithm, made_at) else { return Ok(()) };
            let units = WordUnits::of(&algorithm);
            prop_assert!(units.is_some(), "a policy whose states pack is decided on its word");
            let Some(units) = units else { return Ok(()) };
            let window_ms = algorithm.window_ms();
            let mut now = made_at;
            let first = algorithm.evaluate_cost(None, now, 1).admitted_state;
            let mut word = packing.encode(&first).unwrap_or_default();
            for (advance, cost, how) in steps {
                now = match how {
                    0 => now.saturating_sub(advance),
                    // Far ahead: the time no longer fits the slot's span.
                    1 if advance == 0 => now + (1 << SPAN_BITS),
                    // A window or more ahead.
                    2 => now + window_ms * (advance % 3),
                    _ => now + advance,
                };
                let expected = algorithm.evaluate_cost(Some(packing.decode(word)), now, cost);
                let got = match &units {
                    WordUnits::Bucket(bucket) => packing.decide_bucket(word, bucket, now, cost),
                    WordUnits::Window(window) => packing.decide_window(word, window, now, cost),
                };
                let got = got.expect("its terms");
                match got {
                    WordDecision::Refused(outcome) => {
                        prop_assert!(!expected.admitted);
                        prop_assert_eq!(outcome, expected.outcome);
                    }
                    WordDecision::Admitted(outcome, next) => {
                        prop_assert!(expected.admitted);
                        prop_assert_eq!(outcome, expected.outcome);
                        prop_assert_eq!(Some(next), packing.encode(&expected.admitted_state));
                        word = next;
                    }
                    WordDecision::DoesNotFit => {
                        prop_assert!(expected.admitted);
                        prop_assert_eq!(None, packing.encode(&expected.admitted_state));
                    }
                }
            }
        }

        /// A window packs only where its word's arithmetic fits in 64 bits (what two
        /// counts below the packing's limit weigh), and every policy that packs has the
        /// numbers its word is decided with.
        #[test]
        fn a_window_packs_where_its_arithmetic_fits(limit in 1u64..1_000_000, shift in 0u32..40) {
            let ms = 1u64 << shift;
            let Ok(algorithm) = Algorithm::try_sliding_window(limit, Duration::from_millis(ms)) else {
                return Ok(());
            };
            let packing = Packing::of(&algorithm, NOW);
            prop_assert_eq!(packing.is_some(), WordUnits::of(&algorithm).is_some());
            if let Some(Packing::Window { count_bits, .. }) = packing {
                prop_assert!(u128::from(ms) << (count_bits + 1) <= u128::from(u64::MAX));
            }
        }

        /// Whatever the arithmetic writes within a slot's span packs and unpacks to itself.
        #[test]
        fn states_the_arithmetic_writes_round_trip(
            algorithm in algorithms(),
            steps in prop::collection::vec((0u64..5_000, 0u64..4), 1..40),
        ) {
            let Some(packing) = Packing::of(&algorithm, NOW) else { return Ok(()) };
            let mut state = None;
            let mut now = NOW;
            for (advance, cost) in steps {
                now += advance;
                let evaluation = algorithm.evaluate_cost(state.clone(), now, cost);
                if evaluation.admitted {
                    let word = packing.encode(&evaluation.admitted_state);
                    prop_assert!(word.is_some(), "{:?} did not pack", evaluation.admitted_state);
                    let word = word.unwrap_or_default();
                    prop_assert_eq!(packing.decode(word), evaluation.admitted_state.clone());
                    let words = packing.to_words();
                    let back = Packing::from_words(words.window, words.first, words.second);
                    prop_assert_eq!(back, packing);
                    state = Some(evaluation.admitted_state);
                }
            }
        }
    }
}
