//! The layer, one backend's window shared by every service it wraps, and its settings: K, the
//! window, what counts as a refusal, the clock and the random source.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::config::Config;
use super::rejection::Shared;
use super::service::AdaptiveThrottle;
use crate::store::clock::Clock;

/// Throttles outgoing HTTP calls on the client side: the Google SRE adaptive throttle.
///
/// Wraps any `Service<http::Request<B>, Response = http::Response<R>>` whose error converts
/// into tower's boxed error (a hyper client, a tower stack in front of one). Over a sliding window kept in buckets (two minutes in
/// 120 one-second buckets by default) it counts the requests this client attempted and
/// those the backend accepted, and before each call rejects locally with probability
/// `max(0, (requests - K * accepts) / (requests + 1))`, K = 2 by default. A local rejection
/// fails with a boxed [`NotSent`](super::NotSent) (the service's error is tower's
/// `Box<dyn Error + Send + Sync>`, as with tower's `Timeout` and `LoadShed`); the request
/// never reaches the inner service.
///
/// What counts as accepted: every response except those whose status is in the rejection
/// set (429 and 503 by default, see [`rejection_statuses`](Self::rejection_statuses)).
/// An error of the inner service counts as not accepted, and so does a call whose future
/// is dropped before it answers (a timeout outside this layer). Locally rejected requests
/// count in `requests`.
///
/// One layer is one backend's window: clones of the layer, every service it wraps and
/// their clones share it. Give each backend its own layer.
///
/// Each local rejection increments the counter `tollgate_client_throttled_total`, labelled
/// `layer` with the [name](Self::name) of the layer, through the
/// `metrics` facade, and logs a `tracing` event at debug level.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tollgate::client::{AdaptiveThrottleLayer, NotSent};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let throttle = AdaptiveThrottleLayer::new().name("payments");
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
///         Err(error) if error.is::<NotSent>() => throttled += 1,
///         Err(error) => panic!("the backend never fails: {error}"),
///     }
/// }
/// // With nothing accepted, almost every request after the first few stays local.
/// assert!(sent < 50, "{sent} sent");
/// assert_eq!(sent + throttled, 1_000);
/// assert_eq!(throttle.requests(), 1_000);
/// # }
/// ```
#[derive(Clone)]
pub struct AdaptiveThrottleLayer {
    pub(super) shared: Arc<Shared>,
}

impl AdaptiveThrottleLayer {
    /// A layer with the defaults: K = 2, two minutes in 120 buckets, 429 and 503 count as
    /// rejections, the system clock, a per-layer
    /// random source.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    ///
    /// let layer = AdaptiveThrottleLayer::new();
    /// assert_eq!(layer.rejection_probability(), 0.0);
    /// ```
    pub fn new() -> Self {
        Self::from_config(Config::default())
    }

    /// Requests attempted in the window now, locally rejected ones included.
    ///
    /// Each reading looks at the window as it is when called: under concurrent calls,
    /// [`requests`](Self::requests), [`accepts`](Self::accepts) and
    /// [`rejection_probability`](Self::rejection_probability) read one after another may
    /// see different windows.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().requests(), 0);
    /// ```
    pub fn requests(&self) -> u64 {
        self.shared.stats().requests
    }

    /// Requests in the window now that the backend accepted.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().accepts(), 0);
    /// ```
    pub fn accepts(&self) -> u64 {
        self.shared.stats().accepts
    }

    /// `max(0, (requests - K * accepts) / (requests + 1))` over the window now: the
    /// probability that the next request is rejected locally.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().rejection_probability(), 0.0);
    /// ```
    pub fn rejection_probability(&self) -> f64 {
        self.shared.stats().probability
    }
}

client_layer!(AdaptiveThrottleLayer, service: AdaptiveThrottle, shared: Shared, config: Config);

/// Configuration, tower-http style: each method takes the layer and returns it with the
/// setting changed, and with an empty window (configure a layer before cloning it or
/// wrapping services with it).
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use tollgate::client::AdaptiveThrottleLayer;
/// use tollgate::store::ManualClock;
///
/// let layer = AdaptiveThrottleLayer::new()
///     .name("search")
///     .k(2.0)
///     .window(Duration::from_secs(120), 120)
///     .rejection_statuses([StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE])
///     .clock(ManualClock::new(0))
///     .random(|| 0.5);
/// assert!(format!("{layer:?}").contains(r#"name: "search""#));
/// ```
impl AdaptiveThrottleLayer {
    /// Names the layer in metric labels and logs (default `"default"`). Name it after the
    /// backend it protects.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// let layer = AdaptiveThrottleLayer::new().name("billing");
    /// assert!(format!("{layer:?}").contains(r#"name: "billing""#));
    /// ```
    pub fn name(self, name: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        self.configure(|config| config.name = name)
    }

    /// K, the multiplier of accepts (default 2, at least 1): under sustained refusals the
    /// traffic that reaches the backend settles at about K times what it accepts. Lower
    /// values reject more aggressively and waste less of the backend's capacity on
    /// refusals; higher ones let more through and notice a recovery sooner. Values below
    /// 1, and NaN, are raised to 1.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// let layer = AdaptiveThrottleLayer::new().k(1.1);
    /// # drop(layer);
    /// ```
    pub fn k(self, k: f64) -> Self {
        self.configure(|config| config.k = k.max(1.0))
    }

    /// The sliding window and how many buckets keep it (default two minutes in 120
    /// buckets). The window slides a bucket at a time: a request leaves the counts between
    /// `window - window / buckets` and `window` after it was made. Each bucket lasts
    /// `window / buckets`, rounded down to whole milliseconds and at least 1 ms; there is
    /// at least one bucket.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// // One minute in six ten-second buckets.
    /// let layer = AdaptiveThrottleLayer::new().window(Duration::from_secs(60), 6);
    /// # drop(layer);
    /// ```
    pub fn window(self, window: Duration, buckets: u32) -> Self {
        self.configure(|config| config.set_window(window, buckets))
    }

    /// The response statuses that count as the backend refusing the request (default 429
    /// and 503); every other response counts as accepted. An empty set counts every
    /// response as accepted, so only errors of the inner service count against it.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// // This backend also sheds load with 502 from its proxy.
    /// let layer = AdaptiveThrottleLayer::new().rejection_statuses([
    ///     StatusCode::TOO_MANY_REQUESTS,
    ///     StatusCode::BAD_GATEWAY,
    ///     StatusCode::SERVICE_UNAVAILABLE,
    /// ]);
    /// # drop(layer);
    /// ```
    pub fn rejection_statuses(self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        let mut statuses: Vec<StatusCode> = statuses.into_iter().collect();
        statuses.sort_unstable();
        statuses.dedup();
        self.configure(|config| config.rejection_statuses = statuses.into())
    }

    /// Reads time from `clock` (default the system clock), such as a
    /// [`ManualClock`](crate::store::ManualClock) in tests.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tollgate::store::ManualClock;
    /// let clock = ManualClock::new(1_800_000_000_000);
    /// let layer = AdaptiveThrottleLayer::new().clock(clock.clone());
    /// # drop(layer);
    /// ```
    pub fn clock(self, clock: impl Clock) -> Self {
        self.configure(|config| config.clock = Arc::new(clock))
    }

    /// Replaces the random source: a number in `[0, 1)` per call, drawn only when the
    /// rejection probability is above 0; the request is rejected when the number is below
    /// it. For tests. The default is the crate's own random source, seeded per layer.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use tollgate::client::AdaptiveThrottleLayer;
    ///
    /// // A deterministic sequence: 0.0, 0.1, ..., 0.9, 0.0, ...
    /// let n = Arc::new(AtomicU64::new(0));
    /// let layer = AdaptiveThrottleLayer::new()
    ///     .random(move || (n.fetch_add(1, Ordering::Relaxed) % 10) as f64 / 10.0);
    /// # drop(layer);
    /// ```
    pub fn random(self, random: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.configure(|config| config.random = Some(Arc::new(random)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_arithmetic() {
        let window = |layer: &AdaptiveThrottleLayer| {
            (layer.shared.config.bucket_ms, layer.shared.config.buckets)
        };
        let b = AdaptiveThrottleLayer::new();
        assert_eq!(window(&b), (1_000, 120));
        let b = b.window(Duration::from_millis(5), 10);
        assert_eq!(window(&b), (1, 5));
        let b = b.window(Duration::ZERO, 0);
        assert_eq!(window(&b), (1, 1));
        let b = b.window(Duration::from_secs(10), 3);
        assert_eq!(window(&b), (3_333, 3));
        assert_eq!(AdaptiveThrottleLayer::new().k(0.5).shared.config.k, 1.0);
        assert_eq!(
            AdaptiveThrottleLayer::new().k(f64::NAN).shared.config.k,
            1.0
        );
    }
}
