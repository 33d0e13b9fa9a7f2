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
        static ORIGIN: OnceLock<(quanta::Clock, u64, u64)> = OnceLock::new();
        let (clock, origin, unix_millis) = ORIGIN.get_or_init(|| {
            let clock = quanta::Clock::new();
            let origin = clock.raw();
            let unix = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            (
                clock,
                origin,
                u64::try_from(unix.as_millis()).unwrap_or(u64::MAX),
            )
        });
        let elapsed = clock.delta_as_nanos(*origin, clock.raw()) / 1_000_000;
        let now = unix_millis.saturating_add(elapsed);
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
}
