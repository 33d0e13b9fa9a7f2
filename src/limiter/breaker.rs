//! The circuit breaker: stop waiting on a store that keeps failing.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::store::backend::StoreError;
use crate::store::clock::Clock;
use crate::store::random::RandomSource;

/// How the breaker behaves.
///
/// By default it opens after 5 consecutive failures and stays open 250 ms to 500 ms the
/// first time; each failed probe doubles the ceiling of the interval, up to 1 s. The
/// interval is jittered from the first opening on, so instances that lost the store
/// together do not probe it in lockstep: after `n` failed probes it is drawn between half
/// its ceiling and its ceiling, `min(base_open * 2^n, max_open)`, and is never longer than
/// `max_open`. While traffic flows, an instance is therefore back on the store within
/// `max_open` (plus one store call) of the store's return, however long the outage was.
///
/// ```
/// use std::time::Duration;
/// use tollgate::BreakerConfig;
///
/// let defaults = BreakerConfig::default();
/// assert_eq!(defaults.threshold(), 5);
/// assert_eq!(defaults.base_open_duration(), Duration::from_millis(500));
/// assert_eq!(defaults.max_open_duration(), Duration::from_secs(1));
///
/// let config = BreakerConfig::default()
///     .failure_threshold(3)
///     .base_open(Duration::from_millis(200))
///     .max_open(Duration::from_secs(2));
/// assert_eq!(config.threshold(), 3);
/// assert_eq!(config.max_open_duration(), Duration::from_secs(2));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    failure_threshold: u32,
    base_open_ms: u64,
    max_open_ms: u64,
}

impl Default for BreakerConfig {
    /// Opens after 5 consecutive failures, for 250-500 ms at first, the ceiling doubling per
    /// failed probe to at most 1 s.
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            base_open_ms: 500,
            max_open_ms: 1_000,
        }
    }
}

impl BreakerConfig {
    /// Consecutive failures that open the breaker (at least 1).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// The ceiling of the first open interval (at least 1 ms; default 500 ms). The
    /// interval itself is drawn between half of it and all of it.
    pub fn base_open(mut self, duration: Duration) -> Self {
        self.base_open_ms = millis(duration).max(1);
        self
    }

    /// The longest the breaker stays open, however many probes failed (at least 1 ms;
    /// default 1 s). This bounds how long an instance stays on its failure policy after
    /// the store returns, so keep it short.
    pub fn max_open(mut self, duration: Duration) -> Self {
        self.max_open_ms = millis(duration).max(1);
        self
    }

    /// Consecutive failures that open the breaker.
    ///
    /// ```
    /// assert_eq!(tollgate::BreakerConfig::default().failure_threshold(0).threshold(), 1);
    /// ```
    pub fn threshold(&self) -> u32 {
        self.failure_threshold
    }

    /// The ceiling of the first open interval.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = tollgate::BreakerConfig::default().base_open(Duration::from_millis(300));
    /// assert_eq!(config.base_open_duration(), Duration::from_millis(300));
    /// ```
    pub fn base_open_duration(&self) -> Duration {
        Duration::from_millis(self.base_open_ms)
    }

    /// The longest open interval.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = tollgate::BreakerConfig::default().max_open(Duration::from_secs(2));
    /// assert_eq!(config.max_open_duration(), Duration::from_secs(2));
    /// ```
    pub fn max_open_duration(&self) -> Duration {
        Duration::from_millis(self.max_open_ms)
    }

    /// The bounds of the open interval after `failed_probes` failed probes: the ceiling is
    /// `base * 2^failed_probes`, capped at the maximum, and the floor half of it (at least
    /// 1 ms), so the interval is jittered from the first opening and never exceeds the cap.
    pub(crate) fn open_bounds(&self, failed_probes: u32) -> (u64, u64) {
        let ceiling = self
            .base_open_ms
            .saturating_mul(1u64 << failed_probes.min(32))
            .min(self.max_open_ms)
            .max(1);
        ((ceiling / 2).max(1), ceiling)
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
/// interval, then lets exactly one probe through; only a successful probe closes it.
///
/// Every opening (and every [reset](Breaker::reset)) starts a new epoch. A permit remembers
/// the epoch it was admitted in, and the outcome of a call admitted before the latest
/// opening is stale: it neither closes the breaker nor counts towards opening it again (an
/// old call that answers late says nothing about the store now).
#[derive(Clone)]
pub(crate) struct Breaker {
    shared: Arc<Shared>,
}

struct Shared {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    jitter: Jitter,
    name: Arc<str>,
    /// The failure domain's label (a node's address), for logs.
    node: Arc<str>,
    state_gauge: metrics::Gauge,
    // Read without the lock on the hot path; changed only under it.
    state: AtomicU8,
    /// Bumped (under the lock) each time the breaker opens from closed.
    epoch: AtomicU64,
    consecutive_failures: AtomicU32,
    // The open breaker's deadline and its probe, written only under the lock but read
    // without it, so that a refusal while open costs two atomic loads, not a lock.
    open_until_ms: AtomicU64,
    probe_in_flight: AtomicBool,
    /// The latest failure found no connection to call on (the store was not asked): the
    /// breaker then waits for the connection, not for its interval (see `connected`).
    waiting_for_connection: AtomicBool,
    transitions: Mutex<Transitions>,
}

#[derive(Default)]
struct Transitions {
    failed_probes: u32,
}

/// Permission to call the store, returned by [`Breaker::admit`]. Record the outcome with
/// [`Permit::success`] or [`Permit::failure`]; a probe dropped without an outcome (its
/// caller went away) frees the probe slot for the next request.
pub(crate) struct Permit {
    breaker: Option<Breaker>,
    probe: bool,
    /// The breaker's epoch when the call was admitted.
    epoch: u64,
}

pub(crate) enum Admission {
    Call(Permit),
    /// Open, or half-open with the probe out: skip the store.
    Reject,
}

impl Breaker {
    /// The breaker of limiter `name` in front of the failure domain labelled `node`.
    pub(crate) fn new(
        config: BreakerConfig,
        clock: Arc<dyn Clock>,
        jitter: Jitter,
        name: Arc<str>,
        node: Arc<str>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                clock,
                jitter,
                state_gauge: crate::limiter::telemetry::breaker_state(&name, &node),
                name,
                node,
                state: AtomicU8::new(CLOSED),
                epoch: AtomicU64::new(0),
                consecutive_failures: AtomicU32::new(0),
                open_until_ms: AtomicU64::new(0),
                probe_in_flight: AtomicBool::new(false),
                waiting_for_connection: AtomicBool::new(false),
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
        self.shared
            .open_until_ms
            .load(Ordering::Acquire)
            .saturating_sub(now)
    }

    /// [`admit_at`](Self::admit_at) on the breaker's own clock.
    #[cfg(test)]
    pub(crate) fn admit(&self) -> Admission {
        self.admit_at(|| self.shared.clock.now_millis())
    }

    /// [`admit`](Self::admit) with the time read by `now`, on the breaker's clock, and
    /// only when the breaker is not closed.
    #[inline]
    pub(crate) fn admit_at(&self, now: impl FnOnce() -> u64) -> Admission {
        // The epoch is read before the state: a call that sees the breaker closed carries
        // the epoch of that closed spell, or an older one (then its outcome is ignored).
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        let state = self.shared.state.load(Ordering::Acquire);
        if state == CLOSED {
            return Admission::Call(self.permit(false, epoch));
        }
        let now = now();
        // The common answer while the store is down, without the lock: the deadline is
        // stored before the state that it goes with, so an open state read here comes
        // with its own deadline or a later one.
        if state == OPEN && now < self.shared.open_until_ms.load(Ordering::Acquire) {
            return Admission::Reject;
        }
        self.admit_after_open(state, now)
    }

    /// [`admit_at`](Self::admit_at) for a breaker half open, or open past its deadline:
    /// the one request that probes the store is chosen under the lock.
    #[inline(never)]
    fn admit_after_open(&self, state: u8, now: u64) -> Admission {
        if state == HALF_OPEN && self.shared.probe_in_flight.load(Ordering::Acquire) {
            return Admission::Reject;
        }
        let _t = self.lock();
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        let probing = self.shared.probe_in_flight.load(Ordering::Acquire);
        match self.state() {
            BreakerState::Closed => Admission::Call(self.permit(false, epoch)),
            BreakerState::Open if now < self.shared.open_until_ms.load(Ordering::Acquire) => {
                Admission::Reject
            }
            BreakerState::Open | BreakerState::HalfOpen if !probing => {
                self.shared.probe_in_flight.store(true, Ordering::Release);
                self.set_state(BreakerState::HalfOpen);
                Admission::Call(self.permit(true, epoch))
            }
            BreakerState::Open | BreakerState::HalfOpen => Admission::Reject,
        }
    }

    fn permit(&self, probe: bool, epoch: u64) -> Permit {
        Permit {
            breaker: Some(self.clone()),
            probe,
            epoch,
        }
    }

    fn current(&self, epoch: u64) -> bool {
        self.shared.epoch.load(Ordering::Acquire) == epoch
    }

    fn on_success(&self, probe: bool, epoch: u64) {
        if !probe {
            // Only a probe closes the breaker. A call admitted while it was closed resets
            // the failure count, unless the breaker opened since (its success may be an
            // answer from before the outage, or it raced the opening).
            if self.shared.state.load(Ordering::Acquire) == CLOSED
                && self.current(epoch)
                && self.shared.consecutive_failures.load(Ordering::Relaxed) != 0
            {
                self.shared.consecutive_failures.store(0, Ordering::Relaxed);
            }
            return;
        }
        let mut t = self.lock();
        if !self.current(epoch) {
            // A probe from before a reset: the breaker has started afresh since.
            return;
        }
        self.shared.probe_in_flight.store(false, Ordering::Release);
        self.shared
            .waiting_for_connection
            .store(false, Ordering::Relaxed);
        if self.state() != BreakerState::Closed {
            t.failed_probes = 0;
            self.shared.consecutive_failures.store(0, Ordering::Relaxed);
            self.set_state(BreakerState::Closed);
            tracing::warn!(
                layer = %self.shared.name,
                node = %self.shared.node,
                "store answers again: circuit breaker closed"
            );
        }
    }

    /// Closes the breaker afresh, for a failure domain the store no longer has (a master
    /// that left the cluster): nothing is asked of it any more, so nothing would ever close
    /// it. Outcomes of calls made before are stale from now on.
    pub(crate) fn reset(&self) {
        let mut t = self.lock();
        self.shared
            .waiting_for_connection
            .store(false, Ordering::Relaxed);
        if self.state() == BreakerState::Closed {
            return;
        }
        self.shared.epoch.fetch_add(1, Ordering::AcqRel);
        t.failed_probes = 0;
        self.shared.consecutive_failures.store(0, Ordering::Relaxed);
        self.shared.probe_in_flight.store(false, Ordering::Release);
        self.set_state(BreakerState::Closed);
        tracing::info!(
            layer = %self.shared.name,
            node = %self.shared.node,
            "the store no longer has this part: its circuit breaker is reset"
        );
    }

    fn on_failure(&self, probe: bool, epoch: u64) {
        if !probe {
            // A call from before the latest opening failed late: it was counted (or
            // ignored) in its own epoch already.
            if !self.current(epoch) {
                return;
            }
            let failures = self
                .shared
                .consecutive_failures
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            if failures < self.shared.config.failure_threshold
                || self.state() != BreakerState::Closed
            {
                return;
            }
        }
        let now = self.shared.clock.now_millis();
        let mut t = self.lock();
        if probe {
            if !self.current(epoch) {
                return;
            }
            self.shared.probe_in_flight.store(false, Ordering::Release);
            t.failed_probes = t.failed_probes.saturating_add(1);
        } else if self.state() != BreakerState::Closed || !self.current(epoch) {
            // Another failure opened it first.
            return;
        } else {
            self.shared.epoch.fetch_add(1, Ordering::AcqRel);
        }
        let (low, high) = self.shared.config.open_bounds(t.failed_probes);
        let jitter = (self.shared.jitter)().clamp(0.0, 1.0);
        let open_ms = (low + ((high - low) as f64 * jitter) as u64).min(high);
        self.shared
            .open_until_ms
            .store(now.saturating_add(open_ms), Ordering::Release);
        self.set_state(BreakerState::Open);
        tracing::warn!(
            layer = %self.shared.name,
            node = %self.shared.node,
            open_ms,
            failed_probes = t.failed_probes,
            "store failing: circuit breaker open"
        );
    }

    /// Counts the failure of a call that another part's breaker let through and that
    /// ended at this part (a redirect sent it here): a failure like any other, though no
    /// permit of this breaker was taken for it.
    pub(crate) fn charge(&self, error: &StoreError) {
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        self.permit(false, epoch).failed(error);
    }

    /// The part of the store has a connection again. A breaker that opened (or stayed
    /// open) because its calls found no connection lets the next call probe at once, rather
    /// than after the rest of its interval: what it was waiting for is there. A breaker
    /// opened by the store's own failures (timeouts, errors) keeps its interval.
    pub(crate) fn connected(&self) {
        if !self.shared.waiting_for_connection.load(Ordering::Relaxed) {
            return;
        }
        let _t = self.lock();
        if self
            .shared
            .waiting_for_connection
            .swap(false, Ordering::Relaxed)
            && self.state() == BreakerState::Open
        {
            self.shared.open_until_ms.store(0, Ordering::Release);
        }
    }

    fn release_probe(&self, epoch: u64) {
        let _t = self.lock();
        if self.current(epoch) {
            self.shared.probe_in_flight.store(false, Ordering::Release);
        }
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
    /// Whether this call is the half-open breaker's probe.
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
    }

    pub(crate) fn success(mut self) {
        if let Some(breaker) = self.breaker.take() {
            breaker.on_success(self.probe, self.epoch);
        }
    }

    pub(crate) fn failure(mut self) {
        if let Some(breaker) = self.breaker.take() {
            breaker.on_failure(self.probe, self.epoch);
        }
    }

    /// The call failed with `error`: a failure. One that found no connection to call on
    /// (the store was not asked) counts too, so that an outage opens the breaker as it
    /// always did; but the breaker then waits for the connection rather than for its
    /// interval (see [`Breaker::connected`]).
    pub(crate) fn failed(self, error: &StoreError) {
        if let Some(breaker) = &self.breaker {
            let no_connection = error.is_not_connected();
            breaker
                .shared
                .waiting_for_connection
                .store(no_connection, Ordering::Relaxed);
        }
        self.failure();
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker.take()
            && self.probe
        {
            breaker.release_probe(self.epoch);
        }
    }
}

/// The default jitter: the crate's random source, seeded differently for each breaker.
pub(crate) fn default_jitter() -> Jitter {
    Arc::new(RandomSource::new().into_fn())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::clock::ManualClock;

    fn breaker(clock: &ManualClock, jitter: f64) -> Breaker {
        with_jitter(clock, Arc::new(move || jitter))
    }

    fn with_jitter(clock: &ManualClock, jitter: Jitter) -> Breaker {
        Breaker::new(
            BreakerConfig::default(),
            Arc::new(clock.clone()),
            jitter,
            "test".into(),
            "".into(),
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
    fn defaults_are_documented_ones() {
        let config = BreakerConfig::default();
        assert_eq!(config.threshold(), 5);
        assert_eq!(config.base_open_duration(), Duration::from_millis(500));
        assert_eq!(config.max_open_duration(), Duration::from_secs(1));
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
        // Jitter at its bottom: half the base interval.
        assert_eq!(b.open_for_ms(), 250);
    }

    #[test]
    fn one_probe_at_a_time_and_a_success_closes() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        fail_until_open(&b);
        clock.advance(Duration::from_millis(250));
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
            [500, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000]
        );
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let config = BreakerConfig::default();
        assert_eq!(config.open_bounds(0), (250, 500));
        for probes in 1..100 {
            assert_eq!(config.open_bounds(probes), (500, 1_000));
        }
        let odd = BreakerConfig::default()
            .base_open(Duration::from_millis(3))
            .max_open(Duration::from_millis(1));
        for probes in 0..10 {
            let (low, high) = odd.open_bounds(probes);
            assert!(low >= 1 && low <= high && high <= 1, "{low}..{high}");
        }
        let jitter = default_jitter();
        for _ in 0..10_000 {
            let x = jitter();
            assert!((0.0..1.0).contains(&x));
        }
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.5);
        fail_until_open(&b);
        assert_eq!(b.open_for_ms(), 375); // between 250 and 500, here the middle
        clock.advance(Duration::from_millis(375));
        call(&b).failure(); // one failed probe: between 500 ms and 1 s
        assert_eq!(b.open_for_ms(), 750);
        // Even jitter out of range never leaves the bounds.
        for wild in [-3.0, 7.0, f64::NAN] {
            let b = breaker(&clock, wild);
            fail_until_open(&b);
            let open = b.open_for_ms();
            assert!((250..=500).contains(&open), "{wild}: {open}");
        }
    }

    #[test]
    fn the_first_opening_is_already_spread() {
        // Instances that lost the store at the same moment do not all probe it together.
        let clock = ManualClock::new(0);
        let intervals: Vec<u64> = [0.0, 0.25, 0.5, 0.75, 0.999]
            .into_iter()
            .map(|jitter| {
                let b = breaker(&clock, jitter);
                fail_until_open(&b);
                b.open_for_ms()
            })
            .collect();
        assert_eq!(intervals, [250, 312, 375, 437, 499]);
    }

    #[test]
    fn a_late_success_of_an_old_call_does_not_close_the_breaker() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        // Admitted while closed; its answer comes back only after the breaker opened.
        let old = call(&b);
        let older = call(&b);
        fail_until_open(&b);
        clock.advance(Duration::from_millis(250));
        let probe = call(&b);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        old.success();
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(
            matches!(b.admit(), Admission::Reject),
            "the probe is still the only call out"
        );
        // The probe's failure is what counts: open again, for a longer interval.
        probe.failure();
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.open_for_ms(), 500);
        // While plainly open, a late success does not close it either.
        older.success();
        assert_eq!(b.state(), BreakerState::Open);
        assert!(matches!(b.admit(), Admission::Reject));
    }

    #[test]
    fn a_late_failure_of_an_old_call_does_not_count_after_recovery() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        let stale: Vec<Permit> = (0..5).map(|_| call(&b)).collect();
        fail_until_open(&b);
        clock.advance(Duration::from_millis(250));
        call(&b).success();
        assert_eq!(b.state(), BreakerState::Closed);
        // Four fresh failures, then the five stale calls time out: still closed.
        for _ in 0..4 {
            call(&b).failure();
        }
        for permit in stale {
            permit.failure();
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // A fifth fresh failure opens it.
        call(&b).failure();
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn without_a_connection_the_breaker_opens_and_waits_for_the_connection() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        let not_connected = StoreError::not_connected("no connection");
        // Calls that found no connection open the breaker like any failure.
        for _ in 0..5 {
            call(&b).failed(&not_connected);
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert!(matches!(b.admit(), Admission::Reject));
        // The connection is back before the interval ends: the next call probes at once.
        b.connected();
        let probe = call(&b);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        probe.success();
        assert_eq!(b.state(), BreakerState::Closed);
        // A probe that found no connection again keeps it waiting for the connection.
        for _ in 0..5 {
            call(&b).failed(&not_connected);
        }
        clock.advance(Duration::from_millis(250));
        call(&b).failed(&not_connected);
        assert_eq!(b.state(), BreakerState::Open);
        b.connected();
        call(&b).success();
        assert_eq!(b.state(), BreakerState::Closed);
        // Opened by the store's own failures, the breaker keeps its interval.
        let refused = StoreError::unavailable("refused");
        for _ in 0..5 {
            call(&b).failed(&refused);
        }
        b.connected();
        assert!(matches!(b.admit(), Admission::Reject));
        assert_eq!(b.open_for_ms(), 250);
    }

    #[test]
    fn a_reset_breaker_is_closed_and_ignores_older_calls() {
        let clock = ManualClock::new(0);
        let b = breaker(&clock, 0.0);
        let old = call(&b);
        fail_until_open(&b);
        clock.advance(Duration::from_millis(250));
        let probe = call(&b);
        b.reset();
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.open_for_ms(), 0);
        // Neither the probe out at the reset nor an older call counts afterwards.
        probe.failure();
        old.failure();
        for _ in 0..4 {
            call(&b).failure();
        }
        assert_eq!(b.state(), BreakerState::Closed);
        call(&b).failure();
        assert_eq!(b.state(), BreakerState::Open);
    }

    /// Drives `breakers` through an outage of `outage` with a call to each every 5 ms, each
    /// call failing while the store is down; returns how long after the store's return each
    /// breaker closed.
    fn recovery_after(outage: Duration, jitters: &[Jitter]) -> Vec<u64> {
        const TICK_MS: u64 = 5;
        let clock = ManualClock::new(1_000);
        let breakers: Vec<Breaker> = jitters
            .iter()
            .map(|j| with_jitter(&clock, j.clone()))
            .collect();
        let down_from = clock.now_millis() + 2_000;
        let back_at = down_from + millis(outage);
        let mut closed_after = vec![None; breakers.len()];
        let mut opened = vec![false; breakers.len()];
        while closed_after.iter().any(Option::is_none) {
            let now = clock.now_millis();
            assert!(now < back_at + 60_000, "a breaker never closed");
            let up = now < down_from || now >= back_at;
            for (i, b) in breakers.iter().enumerate() {
                if let Admission::Call(permit) = b.admit() {
                    if up {
                        permit.success();
                    } else {
                        permit.failure();
                    }
                }
                opened[i] |= b.state() != BreakerState::Closed;
                if now >= back_at && closed_after[i].is_none() && b.state() == BreakerState::Closed
                {
                    closed_after[i] = Some(now - back_at);
                }
            }
            clock.advance(Duration::from_millis(TICK_MS));
        }
        assert!(opened.iter().all(|&o| o), "every breaker opened");
        closed_after.into_iter().map(Option::unwrap).collect()
    }

    fn jitters() -> Vec<Jitter> {
        let mut jitters: Vec<Jitter> = (1..=8)
            .map(|seed| Arc::new(RandomSource::seeded(seed).into_fn()) as Jitter)
            .collect();
        for fixed in [0.0, 0.999_999] {
            jitters.push(Arc::new(move || fixed));
        }
        jitters.push(default_jitter());
        jitters
    }

    #[test]
    fn back_on_the_store_within_a_second_of_a_30_s_outage() {
        let closed_after = recovery_after(Duration::from_secs(30), &jitters());
        let worst = closed_after.iter().max().copied().unwrap_or_default();
        assert!(worst <= 1_200, "closed after {closed_after:?} ms");
        // With different jitter the instances do not all probe at the same moment.
        let mut distinct = closed_after.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 1, "all closed together: {closed_after:?}");
    }

    #[test]
    fn back_on_the_store_within_a_second_of_a_10_min_outage() {
        let closed_after = recovery_after(Duration::from_secs(600), &jitters());
        let worst = closed_after.iter().max().copied().unwrap_or_default();
        assert!(worst <= 1_200, "closed after {closed_after:?} ms");
    }
}
