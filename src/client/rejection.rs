//! The state every service of one layer shares to apply the rejection rule (the
//! probability its window gives) before each call and count each answer.

use std::sync::{Arc, Mutex, MutexGuard};

use http::StatusCode;
use metrics::SharedString;

use super::config::{Config, Random};
use super::error::NotSent;
use super::stats::ThrottleStats;
use super::window::{Counts, Window};
use crate::store::random::RandomSource;

/// The counter of requests rejected locally, labelled `layer`.
const THROTTLED_TOTAL: &str = "tollgate_client_throttled_total";

/// What a layer, every service it wraps and their clones share.
pub(super) struct Shared {
    pub(super) config: Config,
    random: Random,
    window: Mutex<Window>,
}

impl Shared {
    /// A layer's state, with an empty window; the random source is the crate's own unless
    /// `config` names one.
    pub(super) fn new(config: Config) -> Self {
        let random = config
            .random
            .clone()
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
    pub(super) fn admit(&self) -> Result<(), NotSent> {
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
        Err(NotSent::throttled(stats))
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
