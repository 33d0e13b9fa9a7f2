//! The in-flight layer and its builder methods.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::admission::{Settings, Shared};
use super::service::InFlight;
use crate::http::key::{AsyncKeyExtractor, ClientIp, MissingKey};
use crate::limiter::failure::FailurePolicy;
use crate::store::slots::SlotStore;

const DEFAULT_SLOT_TTL: Duration = Duration::from_secs(10);
const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(20);

/// A layer that lets at most `limit` requests of one caller run at once, across every
/// instance that shares its store (see [the module](crate::in_flight) for the headers,
/// crash safety and failure policies).
///
/// Callers are told apart by client IP unless [`key`](Self::key) says otherwise; a request
/// without a key is answered as [`on_missing_key`](Self::on_missing_key) says (400 by
/// default).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FailurePolicy, InMemoryBackend, InstanceCount};
/// use tollgate::in_flight::InFlightLayer;
/// use tollgate::key::HeaderKey;
///
/// let layer = InFlightLayer::new("exports", 20, InMemoryBackend::new())
///     .key(HeaderKey::new("x-customer-id"))
///     .slot_ttl(Duration::from_secs(5))
///     .store_timeout(Duration::from_millis(50))
///     .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(4)));
/// assert_eq!(layer.limit(), 20);
/// ```
#[derive(Clone)]
pub struct InFlightLayer<K = ClientIp> {
    shared: Arc<Shared>,
    key: K,
    missing_key: MissingKey,
}

impl InFlightLayer<ClientIp> {
    /// At most `limit` requests in flight per caller, with slots in `store` (an
    /// [`InMemoryBackend`](crate::InMemoryBackend) for one process, a
    /// `RedisBackend` (the `redis` feature) across instances). `name` names the limit in
    /// the store's keys and in metrics: layers that share a name share their slots.
    pub fn new(name: impl Into<Arc<str>>, limit: u64, store: impl SlotStore) -> Self {
        Self {
            shared: Arc::new(Shared::new(Settings {
                name: name.into(),
                limit,
                store: Arc::new(store),
                ttl: DEFAULT_SLOT_TTL,
                timeout: DEFAULT_STORE_TIMEOUT,
                on_failure: FailurePolicy::default(),
            })),
            key: ClientIp::new(),
            missing_key: MissingKey::default(),
        }
    }
}

impl<K> InFlightLayer<K> {
    /// Tells callers apart by what `key` extracts.
    pub fn key<K2: AsyncKeyExtractor>(self, key: K2) -> InFlightLayer<K2> {
        InFlightLayer {
            shared: self.shared,
            key,
            missing_key: self.missing_key,
        }
    }

    /// What to do with a request for which the extractor finds no key (default: 400).
    /// [`MissingKey::Anonymous`] shares one set of slots among all such requests.
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// How long a slot lives in a remote store without being renewed (default 10 s; at
    /// least 3 ms): the bound on how long a crashed instance's slots stay taken. Renewals
    /// are sent every third of it while a request runs.
    pub fn slot_ttl(self, ttl: Duration) -> Self {
        self.with(|settings| settings.ttl = ttl.max(Duration::from_millis(3)))
    }

    /// How long a request waits for the store to take its slot (default 20 ms) before the
    /// failure policy decides it.
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.with(|settings| settings.timeout = timeout)
    }

    /// What a request gets when the store cannot answer (default
    /// [`FailurePolicy::Open`]); see [the module](crate::in_flight#when-the-store-fails).
    pub fn on_store_failure(self, policy: FailurePolicy) -> Self {
        self.with(|settings| settings.on_failure = policy)
    }

    /// The most requests of one caller in flight at once.
    pub fn limit(&self) -> u64 {
        self.shared.settings.limit
    }

    /// Waits, for at most `within`, until the store has been told of every slot this
    /// layer's requests freed so far: whether it has. A slot in a remote store is freed by
    /// a task on the runtime, which a runtime that is shutting down never runs; a graceful
    /// shutdown awaits this after the server has stopped, or the slots of the last
    /// requests stay taken until their [`slot_ttl`](Self::slot_ttl) ends (see
    /// [the module](crate::in_flight#shutting-down)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::InMemoryBackend;
    /// use tollgate::in_flight::InFlightLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let reports = InFlightLayer::new("reports", 2, InMemoryBackend::new());
    /// // ... serve with graceful shutdown until a signal, then:
    /// assert!(reports.flush(Duration::from_secs(1)).await);
    /// # }
    /// ```
    pub fn flush(&self, within: Duration) -> impl Future<Output = bool> + Send + 'static {
        let shared = self.shared.clone();
        async move { shared.releases.flush(within).await }
    }

    fn with(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.shared.settings.clone();
        change(&mut settings);
        self.shared = Arc::new(Shared::new(settings));
        self
    }
}

impl<S, K: Clone> Layer<S> for InFlightLayer<K> {
    type Service = InFlight<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlight::new(
            inner,
            self.shared.clone(),
            self.key.clone(),
            self.missing_key,
        )
    }
}

impl<K: fmt::Debug> fmt::Debug for InFlightLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = &self.shared.settings;
        f.debug_struct("InFlightLayer")
            .field("name", &settings.name)
            .field("limit", &settings.limit)
            .field("store", &settings.store)
            .field("slot_ttl", &settings.ttl)
            .field("store_timeout", &settings.timeout)
            .field("on_store_failure", &settings.on_failure)
            .field("key", &self.key)
            .field("missing_key", &self.missing_key)
            .finish()
    }
}
