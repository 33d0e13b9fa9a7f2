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

use super::{Algorithm, Divisor, Divisors, Numbers, PolicyOutcome, State, gcd};

/// The smallest span of time (log2 of milliseconds) a packed slot covers from its base.
const SPAN_BITS: u32 = 34;

/// How long before its creation a slot's base lies, so that a state a little in the past
/// (a clock that moved back, another instance's slightly slower clock) still fits.
const BASE_MARGIN_MS: u64 = 3_600_000;

/// Whether `algorithm`'s states pack in one word (whenever made: the span a slot covers
/// starts at its making, the bits its counts and levels take do not depend on it).
pub(crate) fn packs(algorithm: &Algorithm) -> bool {
    Packing::of(algorithm, 0).is_some()
}

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
                (bits(limit) <= count_bits).then_some(Packing::Window {
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
            ) => self.encode_numbers([window_start, previous, current], &Divisors::NONE),
            (Packing::Bucket { .. }, &State::TokenBucket { level, updated_ms }) => {
                self.encode_numbers([level, updated_ms, 0], &Divisors::NONE)
            }
            _ => None,
        }
    }

    /// A state given as [`Numbers`] of this packing's kind in one word, if it fits;
    /// `divisors` are the policy's, which divide faster where they are this packing's.
    #[inline]
    pub(crate) fn encode_numbers(self, numbers: Numbers, divisors: &Divisors) -> Option<u64> {
        match self {
            Packing::Window {
                window_ms,
                count_bits,
                base_index,
            } => {
                let [window_start, previous, current] = numbers;
                let index = divisors.period.divide_by(window_start, window_ms);
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
                let units = divisors.unit.divide_by(level, unit);
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

    /// The state a word holds, as [`Numbers`].
    #[inline]
    pub(crate) fn decode_numbers(self, word: u64) -> Numbers {
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

/// A token bucket's numbers in the units its packed level counts in (the greatest common
/// divisor of its rate and period), fixed when its policy is made: what
/// [`Packing::decide_bucket`] decides a packed word with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BucketUnits {
    unit: u64,
    /// Units flowing in per millisecond.
    rate: Divisor,
    /// Units a token takes.
    period: Divisor,
    burst: u64,
    /// Units in a full bucket.
    capacity: u64,
}

impl BucketUnits {
    /// The units of `algorithm`'s packed states, if it is a token bucket whose states pack.
    pub(crate) fn of(algorithm: &Algorithm) -> Option<Self> {
        let Algorithm::TokenBucket {
            rate,
            period_ms,
            burst,
        } = *algorithm
        else {
            return None;
        };
        packs(algorithm).then_some(())?;
        let unit = gcd(rate, period_ms);
        let period = period_ms / unit;
        Some(Self {
            unit,
            rate: Divisor::new(rate / unit),
            period: Divisor::new(period),
            burst,
            capacity: burst.checked_mul(period)?,
        })
    }
}

/// What [`Packing::decide_bucket`] came to.
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
    /// A packed token bucket's decision on a request of `cost` units at `now_ms`, made on
    /// its word in the word's own units: the decision, the state and the report of
    /// decoding it, [`Algorithm::evaluate_numbers`] and encoding the result, without their
    /// conversions (a product and a division by the unit) or their 128-bit products.
    /// `None` when this is not a bucket packed in `bucket`'s units.
    ///
    /// With one token `p` units and `r` units flowing in per millisecond, the arithmetic
    /// on levels `unit` times larger divides out exactly: the refill, the take and the
    /// whole tokens left are the same, and so is the wait, `ceil(unit·x / unit·r)`.
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
        let updated_ms = base_ms + (word >> level_bits);
        // Refilled: a product too large for 64 bits fills the bucket, as in the general
        // arithmetic.
        let flowed = now_ms
            .saturating_sub(updated_ms)
            .saturating_mul(bucket.rate.get());
        let level = (word & level_mask)
            .saturating_add(flowed)
            .min(bucket.capacity);
        // The stored time never moves back.
        let updated_ms = updated_ms.max(now_ms);
        let needed = cost.saturating_mul(bucket.period.get());
        let admitted = cost <= bucket.burst && level >= needed;
        let level = if admitted { level - needed } else { level };
        let remaining = bucket.period.divide(level);
        let units = if admitted { remaining + 1 } else { cost };
        let reset_ms = if (admitted && remaining >= bucket.burst) || units > bucket.burst {
            0
        } else {
            // `units` is at most the burst here, so its product is at most the capacity.
            bucket
                .rate
                .divide_ceil((units * bucket.period.get()).saturating_sub(level))
                .saturating_add(updated_ms - now_ms)
        };
        let outcome = PolicyOutcome {
            admitted,
            remaining,
            reset_ms,
        };
        if !admitted {
            return Some(WordDecision::Refused(outcome));
        }
        let relative = updated_ms - base_ms;
        Some(if relative < 1 << SPAN_BITS && level <= level_mask {
            WordDecision::Admitted(outcome, relative << level_bits | level)
        } else {
            WordDecision::DoesNotFit
        })
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
            assert!(packs(&algorithm));
        }
        let huge = Algorithm::sliding_window(1 << 40, Duration::from_millis(1));
        assert!(Packing::of(&huge, NOW).is_none());
        let log = Algorithm::sliding_log(5, Duration::from_secs(1));
        assert!(Packing::of(&log, NOW).is_none());
        // A billion a second in a window of a second: 30 bits a count, where 19 are left.
        let billion = Algorithm::sliding_window(1_000_000_000, Duration::from_secs(1));
        for algorithm in [huge, log, billion] {
            assert!(!packs(&algorithm), "{algorithm:?}");
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
    /// that do not.
    fn buckets() -> impl Strategy<Value = Algorithm> {
        (1u64..5_000, 1u64..100_000, 1u64..5_000, 1u64..50).prop_filter_map(
            "exact",
            |(rate, ms, burst, common)| {
                let (rate, ms) = (rate * common, ms * common);
                Algorithm::try_token_bucket(rate, Duration::from_millis(ms), burst).ok()
            },
        )
    }

    proptest! {
        /// A bucket decided on its word decides, writes and reports what decoding it, the
        /// arithmetic on numbers and encoding do: clocks that move back, a time before the
        /// slot's base, costs above the burst and words that no longer fit included.
        #[test]
        fn a_bucket_decided_on_its_word_decides_as_its_numbers_do(
            algorithm in buckets(),
            made_at in prop_oneof![Just(0u64), Just(NOW)],
            steps in prop::collection::vec((0u64..20_000, 0u64..8, 0u8..4), 1..60),
        ) {
            let Some(packing) = Packing::of(&algorithm, made_at) else { return Ok(()) };
            let Some(bucket) = BucketUnits::of(&algorithm) else { return Ok(()) };
            let divisors = Divisors::of(&algorithm);
            let mut now = made_at;
            let first = algorithm.evaluate_cost(None, now, 1).admitted_state;
            let mut word = packing.encode(&first).unwrap_or_default();
            for (advance, cost, how) in steps {
                now = match how {
                    0 => now.saturating_sub(advance),
                    // Far ahead: the time no longer fits the slot's span.
                    1 if advance == 0 => now + (1 << SPAN_BITS),
                    _ => now + advance,
                };
                let stored = packing.decode_numbers(word);
                let expected = algorithm
                    .evaluate_numbers(&divisors, false, stored, now, cost)
                    .expect("a bucket's numbers");
                let got = packing.decide_bucket(word, &bucket, now, cost).expect("its units");
                match got {
                    WordDecision::Refused(outcome) => {
                        prop_assert!(!expected.admitted);
                        prop_assert_eq!(outcome, expected.outcome);
                    }
                    WordDecision::Admitted(outcome, next) => {
                        prop_assert!(expected.admitted);
                        prop_assert_eq!(outcome, expected.outcome);
                        prop_assert_eq!(Some(next), packing.encode_numbers(expected.state, &divisors));
                        word = next;
                    }
                    WordDecision::DoesNotFit => {
                        prop_assert!(expected.admitted);
                        prop_assert_eq!(None, packing.encode_numbers(expected.state, &divisors));
                    }
                }
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
