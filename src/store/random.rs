//! Randomness, injectable so that tests draw a sequence they can repeat.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Spreads small seeds (1, 2, 3, ...) over the whole state space (the 64-bit golden ratio).
#[cfg(test)]
const SEED_MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// The crate's one pseudo-random source: numbers in `[0, 1)` from a small, fast xorshift64
/// generator. Not for anything secret.
///
/// It is what the circuit breaker draws its jitter from and what the
/// [adaptive client throttle](crate::client) draws its rejections from, unless they are
/// given any `Fn() -> f64` instead, as tests give a seeded one.
///
/// Clones draw from one sequence: a number one of them draws, the others do not.
///
#[derive(Clone)]
pub(crate) struct RandomSource {
    state: Arc<AtomicU64>,
}

impl RandomSource {
    /// A source seeded differently on each call, in each process: what the crate uses
    /// unless told otherwise, so instances that lost the store together do not probe it
    /// together.
    ///
    pub(crate) fn new() -> Self {
        // std's RandomState takes fresh keys for each call (random per process, then
        // stepped), and the time is mixed in as well.
        let seed =
            std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
        Self::from_state(seed)
    }

    /// A source that draws the same sequence each time it is made with the same `seed`;
    /// neighbouring seeds (1, 2, 3, ...) give unrelated sequences.
    ///
    #[cfg(test)]
    pub(crate) fn seeded(seed: u64) -> Self {
        Self::from_state(seed.wrapping_mul(SEED_MIX))
    }

    /// xorshift never leaves the state 0, so the state is made odd.
    fn from_state(state: u64) -> Self {
        Self {
            state: Arc::new(AtomicU64::new(state | 1)),
        }
    }

    /// The next number, in `[0, 1)`.
    ///
    pub(crate) fn next_f64(&self) -> f64 {
        // Draws from several threads at once may repeat a number; a source of jitter can
        // afford that, and it costs no compare-and-swap loop.
        let mut x = self.state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.store(x, Ordering::Relaxed);
        // The top 53 bits, as many as an f64 holds exactly.
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The source as the closure the builders take.
    ///
    pub(crate) fn into_fn(self) -> impl Fn() -> f64 + Clone + Send + Sync + 'static {
        move || self.next_f64()
    }
}

impl Default for RandomSource {
    /// [`RandomSource::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RandomSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RandomSource").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_stay_in_range_and_clones_share_the_sequence() {
        let random = RandomSource::new();
        for _ in 0..10_000 {
            assert!((0.0..1.0).contains(&random.next_f64()));
        }
        let a = RandomSource::seeded(3);
        let b = a.clone();
        let first = a.next_f64();
        assert_ne!(b.next_f64(), first);
        // Seed 0 is a valid seed, not a generator stuck at 0.
        let zero = RandomSource::seeded(0);
        assert!((0..10).map(|_| zero.next_f64()).any(|x| x > 0.0));
    }

    #[test]
    fn two_unseeded_sources_differ() {
        let (a, b) = (RandomSource::new(), RandomSource::new());
        let a: Vec<f64> = (0..4).map(|_| a.next_f64()).collect();
        let b: Vec<f64> = (0..4).map(|_| b.next_f64()).collect();
        assert_ne!(a, b);
    }
}
