//! What a layer is built from: K, the window, what counts as a refusal, the clock and the
//! random source, with their defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::store::clock::{Clock, SystemClock};

const DEFAULT_K: f64 = 2.0;
const DEFAULT_WINDOW_MS: u64 = 120_000;
const DEFAULT_BUCKETS: u32 = 120;

/// A source of numbers in `[0, 1)`, one per call.
pub(super) type Random = Arc<dyn Fn() -> f64 + Send + Sync>;

/// What a layer is built from.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) name: Arc<str>,
    pub(super) k: f64,
    pub(super) bucket_ms: u64,
    pub(super) buckets: u32,
    pub(super) rejection_statuses: Arc<[StatusCode]>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) random: Option<Random>,
}

impl Default for Config {
    /// K = 2, two minutes in 120 one-second buckets, 429 and 503, the system clock.
    fn default() -> Self {
        Self {
            name: "default".into(),
            k: DEFAULT_K,
            bucket_ms: DEFAULT_WINDOW_MS / u64::from(DEFAULT_BUCKETS),
            buckets: DEFAULT_BUCKETS,
            rejection_statuses: Arc::new([
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE,
            ]),
            clock: Arc::new(SystemClock),
            random: None,
        }
    }
}

impl Config {
    /// The sliding window and its buckets: each bucket lasts `window / buckets`, rounded
    /// down to whole milliseconds and at least 1 ms, and there is at least one bucket.
    pub(super) fn set_window(&mut self, window: Duration, buckets: u32) {
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        let buckets = buckets.max(1);
        self.buckets = u32::try_from(window_ms)
            .map_or(buckets, |ms| buckets.min(ms))
            .max(1);
        self.bucket_ms = (window_ms / u64::from(self.buckets)).max(1);
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("name", &self.name)
            .field("k", &self.k)
            .field("bucket_ms", &self.bucket_ms)
            .field("buckets", &self.buckets)
            .field("rejection_statuses", &self.rejection_statuses)
            .field("clock", &self.clock)
            .field(
                "random",
                &if self.random.is_some() {
                    "custom"
                } else {
                    "default"
                },
            )
            .finish()
    }
}
