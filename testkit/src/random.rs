//! A seeded source of uniform numbers in [0, 1), for the jitter and sampling hooks of the
//! breaker and the client throttle: the same seed, the same sequence on every run.

use std::sync::Mutex;

/// `splitmix64` from `seed`, as a closure the builders take.
pub fn seeded(seed: u64) -> impl Fn() -> f64 + Send + Sync + 'static {
    let state = Mutex::new(seed);
    move || {
        let mut state = state.lock().unwrap();
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}
