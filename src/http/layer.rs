//! The tower layer.

use std::sync::Arc;

use http::StatusCode;
use tower_layer::Layer;

use crate::http::config::Config;
use crate::http::headers::{HeaderMode, PolicyFieldCache};
use crate::http::key::{ClientIp, KeyExtractor, MissingKey};
use crate::http::service::RateLimit;
use crate::limiter::check::Limiter;

/// Rate-limits each caller of the wrapped service.
///
/// Works with axum's `Router::layer` and `route_layer`, on a `MethodRouter`, and on plain
/// hyper or tower services whose response body yields [`bytes::Bytes`]. A refusal is an
/// HTTP response (429, or 503 when the store fails closed), never an error; errors of the
/// inner service pass through unchanged. Clones share one limiter.
///
/// The key extractor defaults to [`ClientIp`] without trusted proxies.
///
/// ```
/// use axum::{Router, routing::{get, post}};
/// use http::StatusCode;
/// use tollgate::{FailurePolicy, HeaderKey, Limiter, MissingKey, Policy, Quota, RateLimitLayer};
///
/// let orders = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .build();
/// let login = Limiter::builder()
///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
///     .on_store_failure(FailurePolicy::closed())
///     .build();
///
/// let app: Router = Router::new()
///     .route("/orders", get(|| async { "orders" }))
///     .route_layer(
///         RateLimitLayer::new(orders)
///             .key(HeaderKey::new("x-customer-id"))
///             .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
///     )
///     .route("/login", post(|| async { "welcome" }).layer(RateLimitLayer::new(login)));
/// # drop(app);
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitLayer<K = ClientIp> {
    config: Arc<Config<K>>,
}

impl RateLimitLayer<ClientIp> {
    /// A layer that counts callers by client IP with `limiter`'s policies.
    pub fn new(limiter: Limiter) -> Self {
        Self {
            config: Arc::new(Config {
                limiter,
                key: ClientIp::new(),
                missing_key: MissingKey::default(),
                header_mode: HeaderMode::default(),
                unavailable_status: StatusCode::SERVICE_UNAVAILABLE,
                policy_fields: PolicyFieldCache::default(),
            }),
        }
    }
}

impl<K: KeyExtractor> RateLimitLayer<K> {
    /// Counts callers by what `key` extracts.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<K2> {
        let config = self.into_config();
        RateLimitLayer {
            config: Arc::new(Config {
                limiter: config.limiter,
                key,
                missing_key: config.missing_key,
                header_mode: config.header_mode,
                unavailable_status: config.unavailable_status,
                policy_fields: PolicyFieldCache::default(),
            }),
        }
    }

    /// What to do with requests for which the extractor finds no key (default: 400).
    pub fn on_missing_key(self, missing_key: MissingKey) -> Self {
        let mut config = self.into_config();
        // A non-4xx status becomes 400 where the rejection is made (`KeyRejection::new`).
        config.missing_key = missing_key;
        Self {
            config: Arc::new(config),
        }
    }

    /// Which responses carry RateLimit-Policy and RateLimit (default: all).
    pub fn headers(self, mode: HeaderMode) -> Self {
        let mut config = self.into_config();
        config.header_mode = mode;
        Self {
            config: Arc::new(config),
        }
    }

    /// The status of a refusal when the store cannot decide and the limiter fails closed
    /// (default 503 Service Unavailable, with Retry-After). Anything outside 4xx and 5xx,
    /// and 500 itself, is taken as 503: clients retry a 500 at once.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::{FailurePolicy, Limiter, Policy, Quota, RateLimitLayer};
    ///
    /// let login = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
    ///     .on_store_failure(FailurePolicy::closed())
    ///     .build();
    /// let layer = RateLimitLayer::new(login).unavailable_status(StatusCode::TOO_MANY_REQUESTS);
    /// # drop(layer);
    /// ```
    pub fn unavailable_status(self, status: StatusCode) -> Self {
        let mut config = self.into_config();
        config.unavailable_status = if (status.is_client_error() || status.is_server_error())
            && status != StatusCode::INTERNAL_SERVER_ERROR
        {
            status
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        Self {
            config: Arc::new(config),
        }
    }

    /// The limiter this layer decides with.
    pub fn limiter(&self) -> &Limiter {
        &self.config.limiter
    }

    fn into_config(self) -> Config<K> {
        Arc::try_unwrap(self.config).unwrap_or_else(|shared| Config {
            limiter: shared.limiter.clone(),
            key: shared.key.clone(),
            missing_key: shared.missing_key,
            header_mode: shared.header_mode,
            unavailable_status: shared.unavailable_status,
            policy_fields: PolicyFieldCache::default(),
        })
    }
}

impl<S, K: Clone> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_config(inner, self.config.clone())
    }
}
