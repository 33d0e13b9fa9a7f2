//! The layer: one backend's window, shared by every service it wraps.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::builder::AdaptiveThrottleBuilder;
use super::rejection::Shared;
use super::service::AdaptiveThrottle;
use super::stats::ThrottleStats;

/// Throttles outgoing HTTP calls on the client side: the Google SRE adaptive throttle.
///
/// Wraps any `Service<http::Request<B>, Response = http::Response<R>>` (a hyper client, a
/// tower stack in front of one). Over a sliding window kept in buckets (two minutes in
/// 120 one-second buckets by default) it counts the requests this client attempted and
/// those the backend accepted, and before each call rejects locally with probability
/// `max(0, (requests - K * accepts) / (requests + 1))`, K = 2 by default. A local rejection
/// is the error [`ThrottleError::Throttled`](super::ThrottleError::Throttled); the request
/// never reaches the inner service.
///
/// What counts as accepted: every response except those whose status is in the rejection
/// set (429 and 503 by default, see [`AdaptiveThrottleBuilder::rejection_statuses`]).
/// An error of the inner service counts as not accepted, and so does a call whose future
/// is dropped before it answers (a timeout outside this layer). Locally rejected requests
/// count in `requests`.
///
/// One layer is one backend's window: clones of the layer, every service it wraps and
/// their clones share it. Give each backend its own layer.
///
/// Each local rejection increments the counter `tollgate_client_throttled_total`, labelled
/// `layer` with the [name](AdaptiveThrottleBuilder::name) of the layer, through the
/// `metrics` facade, and logs a `tracing` event at debug level.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tollgate::client::{AdaptiveThrottleLayer, ThrottleError};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let throttle = AdaptiveThrottleLayer::builder().name("payments").build();
/// // A backend that is down: every call answers 503.
/// let client = ServiceBuilder::new()
///     .layer(throttle.clone())
///     .service_fn(|_req: Request<()>| async {
///         let mut response = Response::new(());
///         *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
///         Ok::<_, Infallible>(response)
///     });
///
/// let mut sent = 0;
/// let mut throttled = 0;
/// for _ in 0..1_000 {
///     match client.clone().oneshot(Request::new(())).await {
///         Ok(response) => {
///             assert_eq!(response.status(), 503);
///             sent += 1;
///         }
///         Err(ThrottleError::Throttled(_)) => throttled += 1,
///         Err(ThrottleError::Inner(never)) => match never {},
///     }
/// }
/// // With nothing accepted, almost every request after the first few stays local.
/// assert!(sent < 50, "{sent} sent");
/// assert_eq!(sent + throttled, 1_000);
/// assert_eq!(throttle.stats().requests(), 1_000);
/// # }
/// ```
#[derive(Clone)]
pub struct AdaptiveThrottleLayer {
    pub(super) shared: Arc<Shared>,
}

impl AdaptiveThrottleLayer {
    /// A layer with the defaults: K = 2, two minutes in 120 buckets, 429 and 503 count as
    /// rejections, the [`SystemClock`](crate::store::SystemClock), a per-layer
    /// random source.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    ///
    /// let layer = AdaptiveThrottleLayer::new();
    /// assert_eq!(layer.stats().rejection_probability(), 0.0);
    /// ```
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures a layer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::client::AdaptiveThrottleLayer;
    ///
    /// let layer = AdaptiveThrottleLayer::builder()
    ///     .name("inventory")
    ///     .k(1.5)
    ///     .window(Duration::from_secs(60), 60)
    ///     .build();
    /// assert_eq!(layer.name(), "inventory");
    /// ```
    pub fn builder() -> AdaptiveThrottleBuilder {
        AdaptiveThrottleBuilder::default()
    }

    /// The counts in the window now, and the probability the next request is rejected.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    ///
    /// let stats = AdaptiveThrottleLayer::new().stats();
    /// assert_eq!((stats.requests(), stats.accepts()), (0, 0));
    /// ```
    pub fn stats(&self) -> ThrottleStats {
        self.shared.stats()
    }

    /// The layer's name, used in metric labels and logs.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().name(), "default");
    /// ```
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }
}

impl Default for AdaptiveThrottleLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for AdaptiveThrottleLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveThrottleLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for AdaptiveThrottleLayer {
    type Service = AdaptiveThrottle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveThrottle::new(inner, self.shared.clone())
    }
}
