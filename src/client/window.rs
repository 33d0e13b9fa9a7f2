//! The sliding window: a ring of buckets (two minutes in one-second buckets by default),
//! their totals, and the rejection probability they give.

use super::stats::ThrottleStats;

/// `max(0, (requests - K * accepts) / (requests + 1))`.
fn rejection_probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let requests = requests as f64;
    // K may be infinite; infinity times zero accepts is no accepts.
    let accepted = if accepts == 0 {
        0.0
    } else {
        k * accepts as f64
    };
    ((requests - accepted) / (requests + 1.0)).max(0.0)
}

/// Requests attempted and accepted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) requests: u64,
    pub(super) accepts: u64,
}

/// A ring of buckets, each holding the counts of `bucket_ms` of time, and their totals.
pub(super) struct Window {
    bucket_ms: u64,
    buckets: Box<[Counts]>,
    /// The number (time / bucket_ms) of the newest bucket; bucket n lives at n % len.
    newest: u64,
    total: Counts,
}

impl Window {
    pub(super) fn new(bucket_ms: u64, buckets: u32, now_ms: u64) -> Self {
        let len = usize::try_from(buckets.max(1)).unwrap_or(usize::MAX);
        Self {
            bucket_ms: bucket_ms.max(1),
            buckets: vec![Counts::default(); len].into_boxed_slice(),
            newest: now_ms / bucket_ms.max(1),
            total: Counts::default(),
        }
    }

    /// Empties the buckets that time has pushed out of the window. A clock that runs
    /// backwards keeps writing to the newest bucket.
    pub(super) fn rotate(&mut self, now_ms: u64) {
        let current = now_ms / self.bucket_ms;
        if current <= self.newest {
            return;
        }
        let len = self.buckets.len() as u64;
        let expired = (current - self.newest).min(len);
        for step in 1..=expired {
            let index = ((self.newest + step) % len) as usize;
            let bucket = std::mem::take(&mut self.buckets[index]);
            self.total.requests -= bucket.requests;
            self.total.accepts -= bucket.accepts;
        }
        self.newest = current;
    }

    pub(super) fn add(&mut self, counts: Counts) {
        let index = (self.newest % self.buckets.len() as u64) as usize;
        let bucket = &mut self.buckets[index];
        bucket.requests = bucket.requests.saturating_add(counts.requests);
        bucket.accepts = bucket.accepts.saturating_add(counts.accepts);
        self.total.requests = self.total.requests.saturating_add(counts.requests);
        self.total.accepts = self.total.accepts.saturating_add(counts.accepts);
    }

    pub(super) fn stats(&self, k: f64) -> ThrottleStats {
        ThrottleStats {
            requests: self.total.requests,
            accepts: self.total.accepts,
            probability: rejection_probability(self.total.requests, self.total.accepts, k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_totals_equal_to_the_buckets() {
        let mut window = Window::new(1_000, 4, 10_500);
        let one = Counts {
            requests: 1,
            accepts: 1,
        };
        for now in (10_500..30_000).step_by(250) {
            window.rotate(now);
            window.add(one);
            let sum = window
                .buckets
                .iter()
                .fold(Counts::default(), |a, b| Counts {
                    requests: a.requests + b.requests,
                    accepts: a.accepts + b.accepts,
                });
            assert_eq!(sum, window.total);
            assert!(window.total.requests <= 16);
        }
        // Backwards in time: counted in the newest bucket.
        window.rotate(0);
        window.add(one);
        assert_eq!(window.total.requests, 17);
        // A jump longer than the window empties it.
        window.rotate(1_000_000);
        assert_eq!(window.total, Counts::default());
    }

    #[test]
    fn the_formula() {
        assert_eq!(rejection_probability(0, 0, 2.0), 0.0);
        assert_eq!(rejection_probability(1, 0, 2.0), 0.5);
        assert_eq!(rejection_probability(99, 0, 2.0), 0.99);
        assert_eq!(rejection_probability(10, 3, 2.0), 4.0 / 11.0);
        assert_eq!(rejection_probability(10, 3, 3.0), 1.0 / 11.0);
        assert_eq!(rejection_probability(10, 5, 2.0), 0.0);
        assert_eq!(rejection_probability(10, 10, 1.0), 0.0);
        assert_eq!(rejection_probability(10, 0, f64::INFINITY), 10.0 / 11.0);
        assert_eq!(rejection_probability(10, 1, f64::INFINITY), 0.0);
    }
}
