//! The builder: the partition, how long a call may wait, the longest hold, the clock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use super::layer::HoldBackLayer;
use super::state::Shared;
use crate::store::clock::{Clock, SystemClock};

/// The partition a request belongs to.
pub(super) type PartitionFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// The default longest hold: an hour.
const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(3_600);

/// Configures a [`HoldBackLayer`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::client::HoldBackLayer;
/// use tollgate::store::ManualClock;
///
/// let layer = HoldBackLayer::builder()
///     .name("github")
///     .max_wait(Duration::from_secs(2))
///     .max_hold(Duration::from_secs(600))
///     .clock(ManualClock::new(0))
///     .build();
/// assert_eq!(layer.name(), "github");
/// ```
#[derive(Clone)]
pub struct HoldBackBuilder {
    config: Config,
}

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

impl Default for HoldBackBuilder {
    /// Partitioned by authority, failing held calls at once, holds of at most an hour, the
    /// system clock.
    fn default() -> Self {
        Self {
            config: Config {
                name: "default".into(),
                partition: Arc::new(authority),
                max_wait: Duration::ZERO,
                max_hold: DEFAULT_MAX_HOLD,
                clock: Arc::new(SystemClock),
            },
        }
    }
}

impl HoldBackBuilder {
    /// Names the layer in metric labels and logs (default `"default"`).
    ///
    /// ```
    /// use tollgate::client::HoldBackLayer;
    /// assert_eq!(HoldBackLayer::builder().name("stripe").build().name(), "stripe");
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Chooses the partition of each request from its parts (method, URI, headers,
    /// extensions): what one server's limit covers. The default is the URI's authority (or
    /// `Host`), one partition per server.
    ///
    /// A server that limits per API key limits each key apart: partition by host and a
    /// digest of the key, so that a key told to wait does not hold back the others (and
    /// the key itself is not kept in memory):
    ///
    /// ```
    /// use sha2::{Digest, Sha256};
    /// use tollgate::client::HoldBackLayer;
    ///
    /// let layer = HoldBackLayer::builder()
    ///     .partition(|parts| {
    ///         let host = parts.uri.authority().map_or("", |a| a.as_str());
    ///         let key = parts.headers.get("authorization").map_or(&b""[..], |v| v.as_bytes());
    ///         let digest = Sha256::digest(key);
    ///         let short: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    ///         format!("{host}#{short}")
    ///     })
    ///     .build();
    /// # drop(layer);
    /// ```
    pub fn partition(
        mut self,
        partition: impl Fn(&Parts) -> String + Send + Sync + 'static,
    ) -> Self {
        self.config.partition = Arc::new(partition);
        self
    }

    /// How long a call to a held partition may wait for the hold to end before it is sent
    /// (default zero: it fails at once with [`HeldBack`](super::HeldBack)). A call whose
    /// partition stays held longer than this from when it was made fails at once, without
    /// waiting for a wait that cannot end in time; a hold that grows while it waits (a
    /// response of a call in flight says to wait longer) fails it then.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::client::HoldBackLayer;
    /// // Interactive callers wait up to half a second, no more.
    /// let layer = HoldBackLayer::builder().max_wait(Duration::from_millis(500)).build();
    /// # drop(layer);
    /// ```
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.max_wait = max_wait;
        self
    }

    /// The longest a partition is held, whatever the server asks (default an hour): a
    /// server that sends `Retry-After: 99999999` by mistake does not silence the client
    /// for years.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::client::HoldBackLayer;
    /// let layer = HoldBackLayer::builder().max_hold(Duration::from_secs(60)).build();
    /// # drop(layer);
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.config.max_hold = max_hold;
        self
    }

    /// Reads time from `clock` (default [`SystemClock`]), such as a
    /// [`ManualClock`](crate::store::ManualClock) in tests. Waits (with
    /// [`max_wait`](Self::max_wait)) sleep on tokio's timer and then read this clock again.
    ///
    /// ```
    /// use tollgate::client::HoldBackLayer;
    /// use tollgate::store::ManualClock;
    /// let layer = HoldBackLayer::builder().clock(ManualClock::new(0)).build();
    /// # drop(layer);
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }

    /// Builds the layer, with no partition held.
    ///
    /// ```
    /// use tollgate::client::HoldBackLayer;
    /// let layer = HoldBackLayer::builder().build();
    /// assert_eq!(layer.held_for("api.example.com"), None);
    /// ```
    pub fn build(self) -> HoldBackLayer {
        HoldBackLayer {
            shared: Arc::new(Shared::new(self.config)),
        }
    }
}

impl fmt::Debug for HoldBackBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldBackBuilder")
            .field("config", &self.config)
            .finish()
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
