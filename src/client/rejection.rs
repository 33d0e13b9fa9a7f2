//! The rejection rule: the probability the window gives, and the state every service of
//! one layer shares to apply it before each call and count each answer.

use std::sync::{Arc, Mutex, MutexGuard};

use http::StatusCode;
use metrics::SharedString;

use super::builder::{Config, Random};
use super::error::Throttled;
use super::stats::ThrottleStats;
use super::window::{Counts, Window};
use crate::store::random::RandomSource;

/// The counter of requests rejected locally, labelled `layer`.
const THROTTLED_TOTAL: &str = "tollgate_client_throttled_total";

/// `max(0, (requests - K * accepts) / (requests + 1))`.
pub(super) fn rejection_probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let requests = requests as f64;
    // K may be infinite; infinity times zero accepts is no accepts.
    let accepted = if accepts == 0 {
        0.0
    } else {
        k * accepts as f64
    };
    ((requests - accepted) / (requests + 1.0)).max(0.0)
}

/// What a layer, every service it wraps and their clones share.
pub(super) struct Shared {
    pub(super) config: Config,
    random: Random,
    window: Mutex<Window>,
}

impl Shared {
    /// A layer's state, with an empty window; the random source is the crate's own unless
    /// `config` names one.
    pub(super) fn new(mut config: Config) -> Self {
        let random = config
            .random
            .take()
            .unwrap_or_else(|| Arc::new(RandomSource::new().into_fn()));
        // Described for each layer built, so a recorder installed after an earlier layer
        // gets the description too.
        metrics::describe_counter!(
            THROTTLED_TOTAL,
            metrics::Unit::Count,
            "Outgoing requests an AdaptiveThrottleLayer refused locally, without sending them, \
             by layer."
        );
        let now = config.clock.now_millis();
        let window = Window::new(config.bucket_ms, config.buckets, now);
        Self {
            config,
            random,
            window: Mutex::new(window),
        }
    }

    /// Counts one attempted request and decides whether it goes out.
    pub(super) fn admit(&self) -> Result<(), Throttled> {
        let now = self.config.clock.now_millis();
        let stats = {
            let mut window = self.lock();
            window.rotate(now);
            let stats = window.stats(self.config.k);
            window.add(Counts {
                requests: 1,
                accepts: 0,
            });
            stats
        };
        if stats.probability <= 0.0 || (self.random)() >= stats.probability {
            return Ok(());
        }
        metrics::counter!(
            THROTTLED_TOTAL,
            "layer" => SharedString::from_shared(self.config.name.clone())
        )
        .increment(1);
        tracing::debug!(
            layer = %self.config.name,
            probability = stats.probability,
            requests = stats.requests,
            accepts = stats.accepts,
            "client throttle: request rejected locally"
        );
        Err(Throttled { stats })
    }

    pub(super) fn is_accepted(&self, status: StatusCode) -> bool {
        !self.config.rejection_statuses.contains(&status)
    }

    pub(super) fn record_accept(&self) {
        let now = self.config.clock.now_millis();
        let mut window = self.lock();
        window.rotate(now);
        window.add(Counts {
            requests: 0,
            accepts: 1,
        });
    }

    pub(super) fn stats(&self) -> ThrottleStats {
        let now = self.config.clock.now_millis();
        let mut window = self.lock();
        window.rotate(now);
        window.stats(self.config.k)
    }

    // Every update under this lock keeps the totals equal to the sum of the buckets before
    // it releases the lock and cannot panic midway, so a poisoned lock is still sound.
    fn lock(&self) -> MutexGuard<'_, Window> {
        self.window
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
