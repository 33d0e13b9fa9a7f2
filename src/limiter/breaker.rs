//! The circuit breaker: stop waiting on a store that keeps failing.

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::store::clock::Clock;

/// How the breaker behaves.
///
/// ```
/// use std::time::Duration;
/// use tollgate::BreakerConfig;
///
/// let config = BreakerConfig::default()
///     .failure_threshold(3)
///     .base_open(Duration::from_millis(500))
///     .max_open(Duration::from_secs(10));
/// assert_eq!(config, BreakerConfig::default().failure_threshold(3)
///     .base_open(Duration::from_millis(500)).max_open(Duration::from_secs(10)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    failure_threshold: u32,
    base_open_ms: u64,
    max_open_ms: u64,
}

impl Default for BreakerConfig {
    /// Opens after 5 consecutive failures, for 1 s at first, growing to at most 30 s.
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            base_open_ms: 1_000,
            max_open_ms: 30_000,
        }
    }
}

impl BreakerConfig {
    /// Consecutive failures that open the breaker (at least 1).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// How long the breaker stays open the first time (at least 1 ms).
    pub fn base_open(mut self, duration: Duration) -> Self {
        self.base_open_ms = millis(duration).max(1);
        self
    }

    /// The longest it stays open, however many probes failed.
    pub fn max_open(mut self, duration: Duration) -> Self {
        self.max_open_ms = millis(duration).max(1);
        self
    }

    /// The bounds of the open interval after `failed_probes` failed probes: from the base
    /// interval up to `base * 2^failed_probes`, capped.
    pub(crate) fn open_bounds(&self, failed_probes: u32) -> (u64, u64) {
        let ceiling = self
            .base_open_ms
            .saturating_mul(1u64 << failed_probes.min(32))
            .min(self.max_open_ms);
        (self.base_open_ms.min(ceiling), ceiling)
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Where the breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls skip the store and go straight to the failure policy.
    Open,
    /// One probe call goes to the store; the rest skip it.
    HalfOpen,
}

impl BreakerState {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// A source of jitter: a number in `[0, 1)` per call. Injectable so tests can pin it.
pub(crate) type Jitter = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Opens after consecutive failures, stays open for a jittered, exponentially growing
/// interval, then lets exactly one probe through; a successful probe closes it.
#[derive(Clone)]
pub(crate) struct Breaker {
    shared: Arc<Shared>,
}

struct Shared {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    jitter: Jitter,
    name: Arc<str>,
    state_gauge: metrics::Gauge,
    // Read without the lock on the hot path; changed only under it.
    state: AtomicU8,
    consecutive_failures: AtomicU32,
    transitions: Mutex<Transitions>,
}

#[derive(Default)]
struct Transitions {
    open_until_ms: u64,
    failed_probes: u32,
    probe_in_flight: bool,
}

/// Permission to call the store, returned by [`Breaker::admit`]. Record the outcome with
/// [`Permit::success`] or [`Permit::failure`]; a probe dropped without an outcome (its
/// caller went away) frees the probe slot for the next request.
pub(crate) struct Permit {
    breaker: Option<Breaker>,
    probe: bool,
}

pub(crate) enum Admission {
    Call(Permit),
    /// Open, or half-open with the probe out: skip the store.
    Reject,
}

impl Breaker {
    pub(crate) fn new(
        config: BreakerConfig,
        clock: Arc<dyn Clock>,
        jitter: Jitter,
        name: Arc<str>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                clock,
                jitter,
                state_gauge: crate::limiter::telemetry::breaker_state(&name),
                name,
                state: AtomicU8::new(CLOSED),
                consecutive_failures: AtomicU32::new(0),
                transitions: Mutex::new(Transitions::default()),
            }),
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.shared.state.load(Ordering::Acquire))
    }

    /// How much longer the breaker stays open (0 unless open).
    pub(crate) fn open_for_ms(&self) -> u64 {
        if self.state() != BreakerState::Open {
            return 0;
        }
        let now = self.shared.clock.now_millis();
        self.lock().open_until_ms.saturating_sub(now)
    }

    pub(crate) fn admit(&self) -> Admission {
        if self.shared.state.load(Ordering::Acquire) == CLOSED {
            return Admission::Call(Permit {
                breaker: Some(self.clone()),
                probe: false,
            });
        }
        let now = self.shared.clock.now_millis();
        let mut t = self.lock();
        match self.state() {
            BreakerState::Closed => Admission::Call(Permit {
                breaker: Some(self.clone()),
                probe: false,
            }),
            BreakerState::Open if now < t.open_until_ms => Admission::Reject,
            BreakerState::Open | BreakerState::HalfOpen if !t.probe_in_flight => {
                t.probe_in_flight = true;
                self.set_state(BreakerState::HalfOpen);
                Admission::Call(Permit {
                    breaker: Some(self.clone()),
                    probe: true,
                })
            }
            BreakerState::Open | BreakerState::HalfOpen => Admission::Reject,
        }
    }

    fn on_success(&self, probe: bool) {
        if !probe && self.shared.state.load(Ordering::Acquire) == CLOSED {
            if self.shared.consecutive_failures.load(Ordering::Relaxed) != 0 {
                self.shared.consecutive_failures.store(0, Ordering::Relaxed);
            }
            return;
        }
        let mut t = self.lock();
        if probe {
            t.probe_in_flight = false;
        }
        if self.state() != BreakerState::Closed {
            t.failed_probes = 0;
            self.shared.consecutive_failures.store(0, Ordering::Relaxed);
            self.set_state(BreakerState::Closed);
            tracing::warn!(layer = %self.shared.name, "store answers again: circuit breaker closed");
        }
    }

    fn on_failure(&self, probe: bool) {
        let failures = self
            .shared
            .consecutive_failures
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        if !probe
            && (failures < self.shared.config.failure_threshold
                || self.state() != BreakerState::Closed)
        {
            return;
        }
        let now = self.shared.clock.now_millis();
        let mut t = self.lock();
        if probe {
            t.probe_in_flight = false;
            t.failed_probes = t.failed_probes.saturating_add(1);
        } else if self.state() != BreakerState::Closed {
            return;
        }
        let (low, high) = self.shared.config.open_bounds(t.failed_probes);
        let jitter = (self.shared.jitter)().clamp(0.0, 1.0);
        let open_ms = low + ((high - low) as f64 * jitter) as u64;
        t.open_until_ms = now.saturating_add(open_ms);
        self.set_state(BreakerState::Open);
        tracing::warn!(
            layer = %self.shared.name,
            open_ms,
            failed_probes = t.failed_probes,
            "store failing: circuit breaker open"
        );
    }

    fn release_probe(&self) {
        self.lock().probe_in_flight = false;
    }

    fn set_state(&self, state: BreakerState) {
        let value = match state {
            BreakerState::Closed => CLOSED,
            BreakerState::Open => OPEN,
            BreakerState::HalfOpen => HALF_OPEN,
        };
        self.shared.state.store(value, Ordering::Release);
        self.shared.state_gauge.set(f64::from(value));
    }

    // Every update under this lock is a plain assignment, so a poisoned lock is still sound.
    fn lock(&self) -> MutexGuard<'_, Transitions> {
        self.shared
            .transitions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("state", &self.state())
            .field("config", &self.shared.config)
            .finish()
    }
}

impl Permit {
    pub(crate) fn success(mut self) {
        if let Some(breaker) = self.breaker.take() {
            breaker.on_success(self.probe);
        }
    }

    pub(crate) fn failure(mut self) {
        if let Some(breaker) = self.breaker.take() {
            breaker.on_failure(self.probe);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker.take()
            && self.probe
        {
            breaker.release_probe();
        }
    }
}

/// A small, fast pseudo-random source for jitter (xorshift), seeded per process.
pub(crate) fn default_jitter() -> Jitter {
    use std::hash::BuildHasher;
    let seed =
        std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now()) | 1;
    let state = Arc::new(std::sync::atomic::AtomicU64::new(seed));
    Arc::new(move || {
        let mut x = state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::clock::ManualClock;

    fn breaker(clock: &ManualClock, jitter: f64) -> Breaker {
        Breaker::new(
            BreakerConfig::default(),
            Arc::new(clock.clone()),
            Arc::new(move || jitter),
            "test".into(),
        )
    }

    fn call(breaker: &Breaker) -> Permit {
        match breaker.admit() {
            Admission::Call(permit) => permit,
            Admission::Reject => panic!("rejected while {:?}", breaker.state()),
        }
    }

    fn fail_until_open(breaker: &Breaker) {
        for _ in 0..5 {
            call(breaker).failure();
        }
    }

    #[test]
    fn opens_after_the_threshold_of_consecutive_failures() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        for _ in 0..4 {
            call(&b).failure();
        }
        call(&b).success(); // a success resets the count
        for _ in 0..4 {
            call(&b).failure();
        }
        assert_eq!(b.state(), BreakerState::Closed);
        call(&b).failure();
        assert_eq!(b.state(), BreakerState::Open);
        assert!(matches!(b.admit(), Admission::Reject));
        assert_eq!(b.open_for_ms(), 1_000);
    }

    #[test]
    fn one_probe_at_a_time_and_a_success_closes() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        fail_until_open(&b);
        clock.advance(Duration::from_millis(1_000));
        let probe = call(&b);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(matches!(b.admit(), Admission::Reject));
        probe.success();
        assert_eq!(b.state(), BreakerState::Closed);
        call(&b).success();
    }

    #[test]
    fn an_abandoned_probe_frees_the_slot() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        fail_until_open(&b);
        clock.advance(Duration::from_secs(1));
        drop(call(&b));
        let probe = call(&b);
        probe.failure();
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn backoff_grows_to_its_cap() {
        let clock = ManualClock::new(0);
        // Jitter at its top: the open interval is the ceiling, base * 2^failed probes.
        let b = breaker(&clock, 1.0);
        fail_until_open(&b);
        let mut intervals = Vec::new();
        for _ in 0..8 {
            let open = b.open_for_ms();
            intervals.push(open);
            clock.advance(Duration::from_millis(open));
            call(&b).failure();
        }
        assert_eq!(
            intervals,
            [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]
        );
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let config = BreakerConfig::default();
        for probes in 0..10 {
            let (low, high) = config.open_bounds(probes);
            assert_eq!(low, 1_000);
            assert!(high <= 30_000 && high >= low);
        }
        let jitter = default_jitter();
        for _ in 0..10_000 {
            let x = jitter();
            assert!((0.0..1.0).contains(&x));
        }
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.5);
        fail_until_open(&b);
        clock.advance(Duration::from_secs(1));
        call(&b).failure(); // one failed probe: between 1 s and 2 s, here the middle
        assert_eq!(b.open_for_ms(), 1_500);
    }
}
