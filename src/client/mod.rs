//! Client-side adaptive throttling for outgoing calls (Google SRE book, "Handling Overload").
//!
//! The client keeps, over a sliding window (two minutes by default), how many requests it
//! attempted and how many of them the backend accepted. Before each call it rejects the
//! request locally, without sending it, with probability
//!
//! ```text
//! max(0, (requests - K * accepts) / (requests + 1))
//! ```
//!
//! so that, when the backend keeps refusing, the traffic that still reaches it settles at
//! about K times what it accepts: enough to notice when it recovers, without spending its
//! capacity on refusals. Locally rejected requests count in `requests`, as in the book.
//!
//! This layer needs no store and knows nothing of the rate limiter above it: its only
//! inputs are the responses of the service it wraps, a [`Clock`] and a random source.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics::SharedString;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::limiter::breaker::{Jitter, default_jitter};
use crate::store::clock::{Clock, SystemClock};

/// The counter of requests rejected locally, labelled `layer`.
const THROTTLED_TOTAL: &str = "tollgate_client_throttled_total";

const DEFAULT_K: f64 = 2.0;
const DEFAULT_WINDOW_MS: u64 = 120_000;
const DEFAULT_BUCKETS: u32 = 120;

/// tower's boxed error.
type BoxError = Box<dyn Error + Send + Sync>;

/// Throttles outgoing HTTP calls on the client side: the Google SRE adaptive throttle.
///
/// Wraps any `Service<http::Request<B>, Response = http::Response<R>>` (a hyper client, a
/// tower stack in front of one). Over a sliding window kept in buckets (two minutes in
/// 120 one-second buckets by default) it counts the requests this client attempted and
/// those the backend accepted, and before each call rejects locally with probability
/// `max(0, (requests - K * accepts) / (requests + 1))`, K = 2 by default. A local rejection
/// is the error [`ThrottleError::Throttled`]; the request never reaches the inner service.
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
    shared: Arc<Shared>,
}

impl AdaptiveThrottleLayer {
    /// A layer with the defaults: K = 2, two minutes in 120 buckets, 429 and 503 count as
    /// rejections, the [`SystemClock`], a per-layer xorshift random source.
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
        AdaptiveThrottle {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Configures an [`AdaptiveThrottleLayer`].
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use tollgate::client::AdaptiveThrottleLayer;
/// use tollgate::store::ManualClock;
///
/// let layer = AdaptiveThrottleLayer::builder()
///     .name("search")
///     .k(2.0)
///     .window(Duration::from_secs(120), 120)
///     .rejection_statuses([StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE])
///     .clock(ManualClock::new(0))
///     .random(|| 0.5)
///     .build();
/// # drop(layer);
/// ```
#[derive(Clone)]
pub struct AdaptiveThrottleBuilder {
    config: Config,
}

#[derive(Clone)]
struct Config {
    name: Arc<str>,
    k: f64,
    bucket_ms: u64,
    buckets: u32,
    rejection_statuses: Arc<[StatusCode]>,
    clock: Arc<dyn Clock>,
    random: Option<Jitter>,
}

impl Default for AdaptiveThrottleBuilder {
    /// K = 2, two minutes in 120 one-second buckets, 429 and 503, the system clock.
    fn default() -> Self {
        Self {
            config: Config {
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
            },
        }
    }
}

impl AdaptiveThrottleBuilder {
    /// Names the layer in metric labels and logs (default `"default"`). Name it after the
    /// backend it protects.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// let layer = AdaptiveThrottleLayer::builder().name("billing").build();
    /// assert_eq!(layer.name(), "billing");
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// K, the multiplier of accepts (default 2, at least 1): under sustained refusals the
    /// traffic that reaches the backend settles at about K times what it accepts. Lower
    /// values reject more aggressively and waste less of the backend's capacity on
    /// refusals; higher ones let more through and notice a recovery sooner. Values below
    /// 1, and NaN, are raised to 1.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// let builder = AdaptiveThrottleLayer::builder().k(1.1);
    /// # drop(builder);
    /// ```
    pub fn k(mut self, k: f64) -> Self {
        self.config.k = k.max(1.0);
        self
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
    /// let builder = AdaptiveThrottleLayer::builder().window(Duration::from_secs(60), 6);
    /// # drop(builder);
    /// ```
    pub fn window(mut self, window: Duration, buckets: u32) -> Self {
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        let buckets = buckets.max(1);
        self.config.buckets = u32::try_from(window_ms)
            .map_or(buckets, |ms| buckets.min(ms))
            .max(1);
        self.config.bucket_ms = (window_ms / u64::from(self.config.buckets)).max(1);
        self
    }

    /// The response statuses that count as the backend refusing the request (default 429
    /// and 503); every other response counts as accepted. An empty set counts every
    /// response as accepted, so only errors of the inner service count against it.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// // This backend also sheds load with 502 from its proxy.
    /// let builder = AdaptiveThrottleLayer::builder().rejection_statuses([
    ///     StatusCode::TOO_MANY_REQUESTS,
    ///     StatusCode::BAD_GATEWAY,
    ///     StatusCode::SERVICE_UNAVAILABLE,
    /// ]);
    /// # drop(builder);
    /// ```
    pub fn rejection_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        let mut statuses: Vec<StatusCode> = statuses.into_iter().collect();
        statuses.sort_unstable();
        statuses.dedup();
        self.config.rejection_statuses = statuses.into();
        self
    }

    /// Reads time from `clock` (default [`SystemClock`]), such as a
    /// [`ManualClock`](crate::store::ManualClock) in tests.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tollgate::store::ManualClock;
    /// let clock = ManualClock::new(1_800_000_000_000);
    /// let builder = AdaptiveThrottleLayer::builder().clock(clock.clone());
    /// # drop(builder);
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }

    /// Replaces the random source: a number in `[0, 1)` per call, drawn only when the
    /// rejection probability is above 0; the request is rejected when the number is below
    /// it. For tests. The default is a fast xorshift generator seeded per layer.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use tollgate::client::AdaptiveThrottleLayer;
    ///
    /// // A deterministic sequence: 0.0, 0.1, ..., 0.9, 0.0, ...
    /// let n = Arc::new(AtomicU64::new(0));
    /// let builder = AdaptiveThrottleLayer::builder()
    ///     .random(move || (n.fetch_add(1, Ordering::Relaxed) % 10) as f64 / 10.0);
    /// # drop(builder);
    /// ```
    pub fn random(mut self, random: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.config.random = Some(Arc::new(random));
        self
    }

    /// Builds the layer, with an empty window.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// let layer = AdaptiveThrottleLayer::builder().build();
    /// assert_eq!(layer.stats().requests(), 0);
    /// ```
    pub fn build(self) -> AdaptiveThrottleLayer {
        let mut config = self.config;
        let random = config.random.take().unwrap_or_else(default_jitter);
        let now = config.clock.now_millis();
        let window = Window::new(config.bucket_ms, config.buckets, now);
        AdaptiveThrottleLayer {
            shared: Arc::new(Shared {
                config,
                random,
                window: Mutex::new(window),
            }),
        }
    }
}

impl fmt::Debug for AdaptiveThrottleBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveThrottleBuilder")
            .field("config", &self.config)
            .finish()
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

/// A service whose outgoing calls an [`AdaptiveThrottleLayer`] throttles.
///
/// Its error is [`ThrottleError`]: [`Throttled`](ThrottleError::Throttled) for a request
/// rejected locally, [`Inner`](ThrottleError::Inner) for an error of the wrapped service
/// (readiness errors included). Clones share the layer's window.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use tollgate::client::AdaptiveThrottleLayer;
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let backend = tower::service_fn(|_req: Request<()>| async {
///     Ok::<_, Infallible>(Response::new("ok"))
/// });
/// let client = AdaptiveThrottleLayer::new().layer(backend);
/// let response = client.clone().oneshot(Request::new(())).await.unwrap();
/// assert_eq!(response.into_body(), "ok");
/// assert_eq!((client.stats().requests(), client.stats().accepts()), (1, 1));
/// # }
/// ```
pub struct AdaptiveThrottle<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> AdaptiveThrottle<S> {
    /// The counts in the window now, and the probability the next request is rejected.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tower::Layer;
    /// let client = AdaptiveThrottleLayer::new().layer(());
    /// assert_eq!(client.stats().rejection_probability(), 0.0);
    /// ```
    pub fn stats(&self) -> ThrottleStats {
        self.shared.stats()
    }

    /// The wrapped service.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tower::Layer;
    /// assert_eq!(*AdaptiveThrottleLayer::new().layer(7).get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tower::Layer;
    /// let mut client = AdaptiveThrottleLayer::new().layer(7);
    /// *client.get_mut() += 1;
    /// assert_eq!(*client.get_ref(), 8);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tower::Layer;
    /// assert_eq!(AdaptiveThrottleLayer::new().layer(7).into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for AdaptiveThrottle<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for AdaptiveThrottle<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveThrottle")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AdaptiveThrottle<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = ThrottleError<S::Error>;
    type Future = AdaptiveThrottleFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(ThrottleError::Inner)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // A rejected request leaves the inner service ready (any capacity it reserved in
        // `poll_ready` serves the next call), as tower allows.
        match self.shared.admit() {
            Ok(()) => AdaptiveThrottleFuture {
                kind: Kind::Called {
                    future: self.inner.call(request),
                    shared: self.shared.clone(),
                },
            },
            Err(throttled) => AdaptiveThrottleFuture {
                kind: Kind::Throttled { throttled },
            },
        }
    }
}

pin_project! {
    /// The future of [`AdaptiveThrottle`]'s responses: the inner call, whose response is
    /// counted as accepted or not when it arrives, or a local rejection, ready at once.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tollgate::future::AdaptiveThrottleFuture;
    /// use tower::{Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let backend = tower::service_fn(|_req: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(()))
    /// });
    /// let mut client = AdaptiveThrottleLayer::new().layer(backend);
    /// let future: AdaptiveThrottleFuture<_> = client.ready().await.unwrap().call(Request::new(()));
    /// assert_eq!(future.await.unwrap().status(), 200);
    /// # }
    /// ```
    pub struct AdaptiveThrottleFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called {
            #[pin]
            future: F,
            shared: Arc<Shared>,
        },
        Throttled {
            throttled: Throttled,
        },
    }
}

impl<F> fmt::Debug for AdaptiveThrottleFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Called { .. } => "calling inner service",
            Kind::Throttled { .. } => "throttled",
        };
        f.debug_struct("AdaptiveThrottleFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, ResBody, E> Future for AdaptiveThrottleFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<ResBody>, ThrottleError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, shared } => {
                let result = ready!(future.poll(cx));
                if let Ok(response) = &result
                    && shared.is_accepted(response.status())
                {
                    shared.record_accept();
                }
                Poll::Ready(result.map_err(ThrottleError::Inner))
            }
            KindProj::Throttled { throttled } => {
                Poll::Ready(Err(ThrottleError::Throttled(*throttled)))
            }
        }
    }
}

/// The error of an [`AdaptiveThrottle`] service: the request was rejected locally, or the
/// inner service failed.
///
/// Display and [`source`](Error::source) are those of the inner error for
/// [`Inner`](ThrottleError::Inner) (the wrapper adds nothing to an error chain). Where the
/// stack wants a boxed error (`Box<dyn Error + Send + Sync>`, tower's `BoxError`),
/// [`into_box_error`](ThrottleError::into_box_error) gives one
/// from which [`Throttled`] can be downcast, as tower's own middleware errors are.
///
/// ```
/// use tollgate::client::{ThrottleError, Throttled};
///
/// fn retry_later<E>(error: &ThrottleError<E>) -> bool {
///     match error {
///         // Not sent at all: the backend has been refusing; back off rather than retry.
///         ThrottleError::Throttled(throttled) => throttled.probability() < 0.5,
///         // Sent and failed: the caller's own retry policy applies.
///         ThrottleError::Inner(_) => true,
///     }
/// }
/// # let _ = retry_later::<std::io::Error>;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum ThrottleError<E> {
    /// Rejected locally: the request never reached the inner service.
    Throttled(Throttled),
    /// The inner service failed (or was not ready).
    Inner(E),
}

impl<E> ThrottleError<E> {
    /// Whether the request was rejected locally.
    ///
    /// ```
    /// use tollgate::client::ThrottleError;
    /// assert!(!ThrottleError::Inner("boom").is_throttled());
    /// ```
    pub fn is_throttled(&self) -> bool {
        matches!(self, ThrottleError::Throttled(_))
    }

    /// The local rejection, if it was one.
    ///
    /// ```
    /// use tollgate::client::ThrottleError;
    /// assert!(ThrottleError::Inner("boom").throttled().is_none());
    /// ```
    pub fn throttled(&self) -> Option<&Throttled> {
        match self {
            ThrottleError::Throttled(throttled) => Some(throttled),
            ThrottleError::Inner(_) => None,
        }
    }

    /// The inner service's error, if it was one.
    ///
    /// ```
    /// use tollgate::client::ThrottleError;
    /// assert_eq!(ThrottleError::Inner("boom").into_inner(), Some("boom"));
    /// ```
    pub fn into_inner(self) -> Option<E> {
        match self {
            ThrottleError::Throttled(_) => None,
            ThrottleError::Inner(error) => Some(error),
        }
    }

    /// A boxed error (tower's `BoxError`): the inner error as it boxes itself, or the boxed
    /// [`Throttled`]. Use it with `map_err` when the inner service's error is already boxed
    /// (after tower's `Buffer` or `Timeout`), as a box is not itself an [`Error`].
    ///
    /// ```
    /// use tollgate::client::{ThrottleError, Throttled};
    ///
    /// let inner: Box<dyn std::error::Error + Send + Sync> = "connection reset".into();
    /// let error = ThrottleError::Inner(inner).into_box_error();
    /// assert_eq!(error.to_string(), "connection reset");
    /// assert!(!error.is::<Throttled>());
    /// ```
    pub fn into_box_error(self) -> Box<dyn Error + Send + Sync>
    where
        E: Into<BoxError>,
    {
        match self {
            ThrottleError::Throttled(throttled) => Box::new(throttled),
            ThrottleError::Inner(error) => error.into(),
        }
    }
}

impl<E> From<Throttled> for ThrottleError<E> {
    fn from(throttled: Throttled) -> Self {
        ThrottleError::Throttled(throttled)
    }
}

impl<E: fmt::Display> fmt::Display for ThrottleError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleError::Throttled(throttled) => throttled.fmt(f),
            ThrottleError::Inner(error) => error.fmt(f),
        }
    }
}

impl<E: Error + 'static> Error for ThrottleError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ThrottleError::Throttled(_) => None,
            ThrottleError::Inner(error) => error.source(),
        }
    }
}

/// A request rejected locally by an [`AdaptiveThrottle`], with the window it found.
///
/// ```
/// use tollgate::client::{AdaptiveThrottleLayer, ThrottleError};
/// use tollgate::store::ManualClock;
/// use http::{Request, Response, StatusCode};
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let backend = tower::service_fn(|_req: Request<()>| async {
///     let mut response = Response::new(());
///     *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
///     Ok::<_, std::io::Error>(response)
/// });
/// let client = AdaptiveThrottleLayer::builder()
///     .clock(ManualClock::new(0))
///     .random(|| 0.0) // reject whenever the probability is above 0
///     .build()
///     .layer(backend);
/// assert_eq!(client.clone().oneshot(Request::new(())).await.unwrap().status(), 429);
/// let Err(ThrottleError::Throttled(throttled)) = client.oneshot(Request::new(())).await else {
///     panic!("not throttled");
/// };
/// // One request, none accepted: (1 - 2 * 0) / (1 + 1).
/// assert_eq!(throttled.probability(), 0.5);
/// assert_eq!(throttled.stats().requests(), 1);
/// assert!(throttled.to_string().contains("rejected locally"));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttled {
    stats: ThrottleStats,
}

impl Throttled {
    /// The rejection probability the request met.
    ///
    /// ```
    /// # use tollgate::client::{AdaptiveThrottleLayer, ThrottleError};
    /// # use http::{Request, Response, StatusCode};
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     Err::<Response<()>, _>(std::io::Error::other("connection refused"))
    /// # });
    /// # let client = AdaptiveThrottleLayer::builder().random(|| 0.0).build().layer(backend);
    /// # let _ = client.clone().oneshot(Request::new(())).await;
    /// # let _ = client.clone().oneshot(Request::new(())).await;
    /// // After two failed calls:
    /// let error = client.oneshot(Request::new(())).await.unwrap_err();
    /// assert_eq!(error.throttled().unwrap().probability(), 2.0 / 3.0);
    /// # }
    /// ```
    pub fn probability(&self) -> f64 {
        self.stats.probability
    }

    /// The window as the request found it (before counting the request itself).
    ///
    /// ```
    /// # use tollgate::client::{AdaptiveThrottleLayer, ThrottleError};
    /// # use http::{Request, Response};
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     Err::<Response<()>, _>(std::io::Error::other("connection refused"))
    /// # });
    /// # let client = AdaptiveThrottleLayer::builder().random(|| 0.0).build().layer(backend);
    /// # let _ = client.clone().oneshot(Request::new(())).await;
    /// let error = client.oneshot(Request::new(())).await.unwrap_err();
    /// let stats = error.throttled().unwrap().stats();
    /// assert_eq!((stats.requests(), stats.accepts()), (1, 0));
    /// # }
    /// ```
    pub fn stats(&self) -> ThrottleStats {
        self.stats
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request rejected locally by the adaptive client throttle: the backend accepted \
             {} of the {} requests attempted in its window (rejection probability {:.3})",
            self.stats.accepts, self.stats.requests, self.stats.probability
        )
    }
}

impl Error for Throttled {}

/// The counts in an adaptive throttle's window and the rejection probability they give.
///
/// ```
/// use tollgate::client::AdaptiveThrottleLayer;
///
/// let stats = AdaptiveThrottleLayer::new().stats();
/// assert_eq!(stats.requests(), 0);
/// assert_eq!(stats.accepts(), 0);
/// assert_eq!(stats.rejection_probability(), 0.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottleStats {
    requests: u64,
    accepts: u64,
    probability: f64,
}

impl ThrottleStats {
    /// Requests attempted in the window, locally rejected ones included.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().stats().requests(), 0);
    /// ```
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Requests in the window that the backend accepted.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().stats().accepts(), 0);
    /// ```
    pub fn accepts(&self) -> u64 {
        self.accepts
    }

    /// `max(0, (requests - K * accepts) / (requests + 1))`: the probability that the next
    /// request is rejected locally.
    ///
    /// ```
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// assert_eq!(AdaptiveThrottleLayer::new().stats().rejection_probability(), 0.0);
    /// ```
    pub fn rejection_probability(&self) -> f64 {
        self.probability
    }
}

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

struct Shared {
    config: Config,
    random: Jitter,
    window: Mutex<Window>,
}

impl Shared {
    /// Counts one attempted request and decides whether it goes out.
    fn admit(&self) -> Result<(), Throttled> {
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

    fn is_accepted(&self, status: StatusCode) -> bool {
        !self.config.rejection_statuses.contains(&status)
    }

    fn record_accept(&self) {
        let now = self.config.clock.now_millis();
        let mut window = self.lock();
        window.rotate(now);
        window.add(Counts {
            requests: 0,
            accepts: 1,
        });
    }

    fn stats(&self) -> ThrottleStats {
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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    requests: u64,
    accepts: u64,
}

/// A ring of buckets, each holding the counts of `bucket_ms` of time, and their totals.
struct Window {
    bucket_ms: u64,
    buckets: Box<[Counts]>,
    /// The number (time / bucket_ms) of the newest bucket; bucket n lives at n % len.
    newest: u64,
    total: Counts,
}

impl Window {
    fn new(bucket_ms: u64, buckets: u32, now_ms: u64) -> Self {
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
    fn rotate(&mut self, now_ms: u64) {
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

    fn add(&mut self, counts: Counts) {
        let index = (self.newest % self.buckets.len() as u64) as usize;
        let bucket = &mut self.buckets[index];
        bucket.requests = bucket.requests.saturating_add(counts.requests);
        bucket.accepts = bucket.accepts.saturating_add(counts.accepts);
        self.total.requests = self.total.requests.saturating_add(counts.requests);
        self.total.accepts = self.total.accepts.saturating_add(counts.accepts);
    }

    fn stats(&self, k: f64) -> ThrottleStats {
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
    fn window_arithmetic() {
        let b = AdaptiveThrottleBuilder::default();
        assert_eq!((b.config.bucket_ms, b.config.buckets), (1_000, 120));
        let b = b.window(Duration::from_millis(5), 10);
        assert_eq!((b.config.bucket_ms, b.config.buckets), (1, 5));
        let b = b.window(Duration::ZERO, 0);
        assert_eq!((b.config.bucket_ms, b.config.buckets), (1, 1));
        let b = b.window(Duration::from_secs(10), 3);
        assert_eq!((b.config.bucket_ms, b.config.buckets), (3_333, 3));
        assert_eq!(AdaptiveThrottleBuilder::default().k(0.5).config.k, 1.0);
        assert_eq!(AdaptiveThrottleBuilder::default().k(f64::NAN).config.k, 1.0);
    }
}
