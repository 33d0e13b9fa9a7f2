//! The sliding window counter's numbers, as tollgate's sliding window keeps them (the
//! previous fixed window's count, weighted by how much of it still overlaps the sliding
//! window, plus the current window's count), for the parts of the two-tier store that
//! count outside the global store: a region's share while it is cut off, what that share
//! admitted, and a region's demand.
//!
//! The arithmetic is tollgate's own (`Algorithm::SlidingWindow`,
//! lua/algorithm/sliding_window.lua), written out here in integers so that a port to Lua
//! reads it line for line; the tests check it against tollgate's.

/// A sliding window counter's state: the start of the current fixed window (ms since the
/// epoch), the previous window's count and the current one's. All zero is a counter never
/// used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Window {
    start_ms: u64,
    previous: u64,
    current: u64,
}

impl Window {
    /// A counter holding `units` in the current window of `at_ms`: how a share starts
    /// from what was last known, all of it in the current window (so that it weighs fully
    /// until that window ends, never less than the store's estimate it came from).
    pub(crate) fn seeded(units: u64, window_ms: u64, at_ms: u64) -> Self {
        Self {
            start_ms: at_ms - at_ms % window_ms,
            previous: 0,
            current: units,
        }
    }

    /// The same counter at `now_ms`: the current window becomes the previous one when the
    /// next begins, and both are forgotten a window later. A counter from the future (a
    /// clock that went back) is kept as it is: it only makes the count stricter.
    pub(crate) fn rolled(self, window_ms: u64, now_ms: u64) -> Self {
        let start = now_ms - now_ms % window_ms;
        if self.start_ms >= start {
            self
        } else if self.start_ms + window_ms == start {
            Self {
                start_ms: start,
                previous: self.current,
                current: 0,
            }
        } else {
            Self {
                start_ms: start,
                previous: 0,
                current: 0,
            }
        }
    }

    /// What the counter holds at `now_ms`, times the window: `previous * (window -
    /// elapsed) + current * window`. Kept scaled, so that no division rounds it.
    pub(crate) fn used_scaled(self, window_ms: u64, now_ms: u64) -> u128 {
        let rolled = self.rolled(window_ms, now_ms);
        let w = u128::from(window_ms);
        let elapsed = u128::from(now_ms.saturating_sub(rolled.start_ms).min(window_ms));
        u128::from(rolled.previous) * (w - elapsed) + u128::from(rolled.current) * w
    }

    /// What the counter holds at `now_ms`, rounded up: the units a store reporting it
    /// says are used.
    pub(crate) fn used(self, window_ms: u64, now_ms: u64) -> u64 {
        let w = u128::from(window_ms);
        u64::try_from(self.used_scaled(window_ms, now_ms).div_ceil(w)).unwrap_or(u64::MAX)
    }

    /// How many more units a counter of `limit` per window admits at `now_ms`: `(limit *
    /// window - used_scaled) / window`, rounded down, as tollgate's sliding window reports
    /// `remaining` (and admits a request of `cost` exactly when `cost <= room`).
    pub(crate) fn room(self, limit: u64, window_ms: u64, now_ms: u64) -> u64 {
        let w = u128::from(window_ms);
        let budget = u128::from(limit) * w;
        let left = budget.saturating_sub(self.used_scaled(window_ms, now_ms));
        u64::try_from(left / w).unwrap_or(u64::MAX)
    }

    /// Counts `units` at `now_ms`, whether or not they fit.
    pub(crate) fn add(&mut self, units: u64, window_ms: u64, now_ms: u64) {
        *self = self.rolled(window_ms, now_ms);
        self.current = self.current.saturating_add(units);
    }

    /// Counts `units` at `now_ms` if a counter of `limit` has room for them.
    pub(crate) fn take(&mut self, units: u64, limit: u64, window_ms: u64, now_ms: u64) -> bool {
        let fits = units <= self.room(limit, window_ms, now_ms);
        if fits {
            self.add(units, window_ms, now_ms);
        }
        fits
    }

    /// Both counters' units together, at `now_ms`.
    pub(crate) fn merged(self, other: Window, window_ms: u64, now_ms: u64) -> Self {
        let (a, b) = (
            self.rolled(window_ms, now_ms),
            other.rolled(window_ms, now_ms),
        );
        Self {
            start_ms: a.start_ms.max(b.start_ms),
            previous: a.previous.saturating_add(b.previous),
            current: a.current.saturating_add(b.current),
        }
    }

    /// Whether the counter holds nothing at `now_ms`.
    pub(crate) fn is_empty(self, window_ms: u64, now_ms: u64) -> bool {
        self.used_scaled(window_ms, now_ms) == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tollgate::Policy;
    use tollgate::store::{Algorithm, PolicyState};

    use super::Window;

    /// tollgate's own sliding window, fed the same requests: what it reports remaining.
    fn tollgate_room(limit: u64, window_ms: u64, requests: &[(u64, u64)], now_ms: u64) -> u64 {
        let policies: Arc<[Policy]> = vec![Policy::new(
            "w",
            Algorithm::sliding_window(limit, Duration::from_millis(window_ms)),
        )]
        .into();
        let mut state: Option<PolicyState> = None;
        for &(at, cost) in requests {
            let (_, admitted) = PolicyState::evaluate(&policies, |_| state.clone(), at, cost);
            if let Some(mut states) = admitted {
                state = Some(states.remove(0));
            }
        }
        let (outcome, _) = PolicyState::evaluate(&policies, |_| state.clone(), now_ms, 0);
        outcome.limits()[0].remaining
    }

    #[test]
    fn the_arithmetic_is_tollgates() {
        let (limit, window_ms) = (50, 1_000);
        // Requests of 1 to 7 units every 37 ms over four windows, each admitted as both
        // counters decide; then both report the same room every 13 ms.
        let mut requests = Vec::new();
        let mut window = Window::default();
        for i in 0..110u64 {
            let at = 10_000 + i * 37;
            let cost = 1 + i % 7;
            let fits = window.take(cost, limit, window_ms, at);
            let before = tollgate_room(limit, window_ms, &requests, at);
            assert_eq!(fits, cost <= before, "request {i} at {at}");
            if fits {
                requests.push((at, cost));
            }
        }
        for now in (14_000..16_500).step_by(13) {
            assert_eq!(
                window.room(limit, window_ms, now),
                tollgate_room(limit, window_ms, &requests, now),
                "at {now}"
            );
        }
    }

    #[test]
    fn a_seed_weighs_fully_in_its_window_then_slides_out() {
        let seed = Window::seeded(40, 1_000, 5_300);
        assert_eq!(seed.used(1_000, 5_999), 40);
        assert_eq!(seed.room(50, 1_000, 5_999), 10);
        // Half of the next window: half of the seed still weighs.
        assert_eq!(seed.used(1_000, 6_500), 20);
        assert_eq!(seed.room(50, 1_000, 6_500), 30);
        assert!(seed.is_empty(1_000, 7_000));
        // Merging rolls both to the same window first.
        let mut other = Window::default();
        other.add(5, 1_000, 6_200);
        let both = seed.merged(other, 1_000, 6_200);
        assert_eq!(both.used(1_000, 6_200), 32 + 5);
    }
}
