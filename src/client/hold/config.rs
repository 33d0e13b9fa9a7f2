//! What a layer is built from: its name, the partition, how long a call may wait, the
//! longest hold and the clock, with their defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use crate::store::clock::{Clock, SystemClock};

/// The partition a request belongs to.
pub(super) type PartitionFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// The default longest hold: an hour.
const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(3_600);

/// What a layer is built from.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) name: Arc<str>,
    pub(super) partition: PartitionFn,
    pub(super) max_wait: Duration,
    pub(super) max_hold: Duration,
    pub(super) clock: Arc<dyn Clock>,
}

/// The request URI's authority (`api.example.com:443`), or, for a request whose URI has
/// none (origin-form, as some clients build them), its `Host` header; empty when neither.
pub(super) fn authority(parts: &Parts) -> String {
    if let Some(authority) = parts.uri.authority() {
        return authority.as_str().to_owned();
    }
    parts
        .headers
        .get(http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

impl Default for Config {
    /// Partitioned by authority, failing held calls at once, holds of at most an hour, the
    /// system clock.
    fn default() -> Self {
        Self {
            name: "default".into(),
            partition: Arc::new(authority),
            max_wait: Duration::ZERO,
            max_hold: DEFAULT_MAX_HOLD,
            clock: Arc::new(SystemClock),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("name", &self.name)
            .field("max_wait", &self.max_wait)
            .field("max_hold", &self.max_hold)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
