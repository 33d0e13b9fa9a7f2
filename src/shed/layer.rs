//! The layer: the limit, the shed answer, and the count its services share.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower_layer::Layer;

use super::service::ConcurrencyShed;
use super::slot::Shared;

/// Sheds load: answers 503 with `Retry-After` when more than a set number of requests are
/// in flight through it, with no store at all.
///
/// A request that finds every slot taken is not queued and does not reach the inner
/// service: it gets, at once, `503 Service Unavailable`, `Retry-After` (whole seconds,
/// 1 by default) and an RFC 9457 problem+json body of type
/// [`TEMPORARY_REDUCED_CAPACITY`](crate::response::TEMPORARY_REDUCED_CAPACITY). Errors of the inner
/// service pass through unchanged; nothing this layer does answers 500.
///
/// # What is in flight
///
/// A request holds its slot from the moment the service is called until its response
/// future completes, which is when the inner service has produced the response head, or
/// until that future is dropped: a client that disconnects mid-request gives its slot back
/// as soon as the server drops the request (hyper drops the service future when the
/// connection closes), and so does a handler that panics. The slot is *not* held while
/// the response body streams to the client. That is the same rule as tower's
/// `ConcurrencyLimit`: what is limited is the work of producing responses, which is where
/// ordinary handlers spend their time, and a slow reader cannot keep capacity from other
/// callers. Handlers that do their work while streaming (server-sent events, large
/// generated downloads) are counted only until their first byte; limit those with a cap on
/// connections instead.
///
/// The layer never makes callers wait: `poll_ready` is the inner service's, and the
/// decision to shed is taken in `call`.
///
/// # Sharing
///
/// The count lives in the layer: clones of the layer, every service it wraps and the
/// clones of those services share one limit. axum's `Router::layer` wraps each route
/// separately, but with the one layer, so the limit there is router-wide, not per route.
/// Build one layer per limit you want.
///
/// Place it outside a [`RateLimitLayer`](crate::RateLimitLayer) (added after it with
/// `Router::layer`) so that shed requests cost no store call.
///
/// # Metrics
///
/// | name | type | labels | meaning |
/// |---|---|---|---|
/// | `tollgate_shed_total` | counter | `layer` | requests answered 503 because too many were in flight |
/// | `tollgate_in_flight` | gauge | `layer` | requests holding a slot |
///
/// `layer` is the [name](Self::name) given to the layer, `"shed"` unless set. Shed requests are
/// also logged as `tracing` events at debug level.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use tollgate::shed::ConcurrencyShedLayer;
///
/// // At most 256 requests at once through the whole router; ask the rest to come back
/// // in 2 seconds.
/// let app: Router = Router::new()
///     .route("/orders", get(|| async { "[]" }))
///     .route("/orders/{id}", get(|| async { "{}" }))
///     .layer(
///         ConcurrencyShedLayer::new(256)
///             .name("orders")
///             .retry_after(Duration::from_secs(2)),
///     );
/// # drop(app);
/// ```
#[derive(Clone)]
pub struct ConcurrencyShedLayer {
    max_in_flight: usize,
    retry_after_secs: u64,
    name: Arc<str>,
    in_flight: Arc<AtomicUsize>,
}

impl ConcurrencyShedLayer {
    /// A layer that lets at most `max_in_flight` requests through at once and sheds the
    /// others. With 0 it sheds every request.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// let layer = ConcurrencyShedLayer::new(64);
    /// assert_eq!(layer.max_in_flight(), 64);
    /// assert_eq!(layer.in_flight(), 0);
    /// ```
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            max_in_flight,
            retry_after_secs: 1,
            name: "shed".into(),
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// How long shed callers are asked to wait, sent as `Retry-After` in whole seconds
    /// (rounded up, at least 1; default 1).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// let layer = ConcurrencyShedLayer::new(64).retry_after(Duration::from_millis(1500));
    /// assert_eq!(layer.retry_after_secs(), 2);
    /// ```
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        let whole = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0));
        self.retry_after_secs = whole.max(1);
        self
    }

    /// Names the layer in metric labels and logs (default `"shed"`).
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// let layer = ConcurrencyShedLayer::new(64).name("orders");
    /// assert!(format!("{layer:?}").contains("orders"));
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// The most requests let through at once.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// assert_eq!(ConcurrencyShedLayer::new(8).max_in_flight(), 8);
    /// ```
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// The requests in flight now, through every service this layer (or a clone of it)
    /// wraps.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// let layer = ConcurrencyShedLayer::new(8);
    /// assert_eq!(layer.clone().in_flight(), 0);
    /// ```
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// `Retry-After` of a shed request, in whole seconds.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// assert_eq!(ConcurrencyShedLayer::new(8).retry_after_secs(), 1);
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_secs
    }
}

impl fmt::Debug for ConcurrencyShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyShedLayer")
            .field("name", &self.name)
            .field("max_in_flight", &self.max_in_flight)
            .field("in_flight", &self.in_flight())
            .field("retry_after_secs", &self.retry_after_secs)
            .finish()
    }
}

impl<S> Layer<S> for ConcurrencyShedLayer {
    type Service = ConcurrencyShed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyShed::new(
            inner,
            Shared::new(
                self.max_in_flight,
                self.retry_after_secs,
                self.in_flight.clone(),
                self.name.clone(),
            ),
        )
    }
}
