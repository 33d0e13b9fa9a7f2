//! Time, injectable so that tests run on a clock they control.

use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time in milliseconds since the Unix epoch.
///
/// The in-process backend and (in later layers) the circuit breaker read time only through
/// this trait, so tests drive them with a [`ManualClock`] instead of sleeping. Unless given
/// one, they read the real clock: Unix time read once, then advanced by a monotonic clock,
/// so a wall-clock step (NTP, a VM resume) never moves a window backwards.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch; never goes backwards.
    fn now_millis(&self) -> u64;
}

/// The real clock, the default of everything that reads time: Unix time read once, then
/// advanced by a monotonic clock, so a wall-clock step (NTP, a VM resume) never moves a
/// window backwards.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> u64 {
        // The time-stamp counter through quanta: a few nanoseconds where `Instant::now` is a
        // `clock_gettime` call, and every decision reads the clock.
        static ORIGIN: OnceLock<Origin> = OnceLock::new();
        let origin = ORIGIN.get_or_init(Origin::now);
        let ticks = origin.clock.raw().saturating_sub(origin.ticks);
        let now = origin.unix_millis.saturating_add(origin.millis(ticks));
        // Counters of different cores may disagree slightly: never answer less than a time
        // already given. The shared value is written at most once a millisecond.
        static LATEST: AtomicU64 = AtomicU64::new(0);
        let latest = LATEST.load(Ordering::Relaxed);
        if now > latest {
            LATEST.fetch_max(now, Ordering::Relaxed).max(now)
        } else {
            latest
        }
    }
}

/// The real clock's reading at its start: the counter, and Unix time then.
struct Origin {
    clock: quanta::Clock,
    ticks: u64,
    unix_millis: u64,
    /// Milliseconds a tick of the counter, in 64-bit fixed point: a tick count becomes
    /// milliseconds by one multiplication, where scaling to nanoseconds and dividing them
    /// took two in a row on every decision.
    millis_per_tick: u64,
}

impl Origin {
    /// Ticks over which the counter's rate is read off quanta's calibration: enough that
    /// the rate's rounding moves no reading by a millisecond in years.
    const RATE_TICKS: u64 = 1 << 40;

    fn now() -> Self {
        let clock = quanta::Clock::new();
        let nanos = clock.delta_as_nanos(0, Self::RATE_TICKS);
        Self {
            millis_per_tick: millis_per_tick(nanos, Self::RATE_TICKS),
            ticks: clock.raw(),
            clock,
            unix_millis: u64::try_from(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO)
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
        }
    }

    /// `ticks` of the counter in whole milliseconds.
    #[inline]
    fn millis(&self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.millis_per_tick)) >> 64) as u64
    }
}

/// The milliseconds a tick of a counter that runs `ticks` ticks in `nanos` nanoseconds, in
/// 64-bit fixed point (at most just under one millisecond a tick), rounded up: rounded
/// down, a counter of whole nanoseconds would read a millisecond short at each boundary.
fn millis_per_tick(nanos: u64, ticks: u64) -> u64 {
    let scaled = (u128::from(nanos) << 64).div_ceil(u128::from(ticks.max(1)) * 1_000_000);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::{Clock, ManualClock};
///
/// let clock = ManualClock::new(19_000);
/// clock.advance(Duration::from_millis(1_500));
/// assert_eq!(clock.now_millis(), 20_500);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `millis` until moved.
    pub fn new(millis: u64) -> Self {
        Self {
            millis: Arc::new(AtomicU64::new(millis)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.millis.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the time; a time before the current one is ignored, as real time never runs back.
    pub fn set(&self, millis: u64) {
        self.millis.fetch_max(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.millis.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_reads_unix_time_and_never_runs_back() {
        let first = SystemClock.now_millis();
        assert!(first > 1_700_000_000_000);
        assert!(SystemClock.now_millis() >= first);
    }

    #[test]
    fn ticks_become_milliseconds_by_one_multiplication() {
        let at = |nanos_per_tick: f64, ticks: u64| {
            let rate = millis_per_tick(
                (Origin::RATE_TICKS as f64 * nanos_per_tick) as u64,
                Origin::RATE_TICKS,
            );
            let origin = Origin {
                clock: quanta::Clock::new(),
                ticks: 0,
                unix_millis: 0,
                millis_per_tick: rate,
            };
            origin.millis(ticks)
        };
        // A 3 GHz counter: a year of ticks, to the millisecond.
        let year_ms = 365 * 86_400_000u64;
        let ticks = year_ms * 3_000_000;
        assert!(
            at(1.0 / 3.0, ticks).abs_diff(year_ms) <= 1,
            "{}",
            at(1.0 / 3.0, ticks)
        );
        // Whole milliseconds, never rounded up: 2,999,999 ticks are not yet one.
        assert_eq!(at(1.0 / 3.0, 2_999_999), 0);
        assert_eq!(at(1.0 / 3.0, 3_000_001), 1);
        // A counter of nanoseconds (quanta's fallback where there is none of its own).
        assert_eq!(at(1.0, 86_400_000_000_000), 86_400_000);
        // The real counter agrees with quanta's own scaling.
        let clock = quanta::Clock::new();
        let origin = Origin::now();
        let ticks = 1u64 << 45;
        let quanta_ms = clock.delta_as_nanos(0, ticks) / 1_000_000;
        assert!(origin.millis(ticks).abs_diff(quanta_ms) <= 1);
    }
}
