//! The layer: the limit, its priority classes, the shed answer, and the counts its
//! services share.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tower_layer::Layer;

use super::service::ConcurrencyShed;
use super::slot::{Ceilings, Classifiers, Counts, MAX_COUNTED, Shared};

/// Sheds load: answers 503 with `Retry-After` when more than a set number of requests are
/// in flight through it, with no store at all.
///
/// A request that finds no slot free for it (every slot taken, or those left kept for a
/// higher [priority class](#priority-classes)) is not queued and does not reach the inner
/// service: it gets, at once, `503 Service Unavailable`, `Retry-After` (whole seconds,
/// 1 by default) and an RFC 9457 problem+json body of type
/// [`ProblemType::TemporaryReducedCapacity`](crate::response::ProblemType::TemporaryReducedCapacity). Errors of the inner
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
/// # Priority classes
///
/// Every request is *normal* unless predicates on its head (method, URI, headers,
/// extensions) say otherwise: [`critical_when`](Self::critical_when) picks the requests
/// that must get through (a login, a health check, a payment), and
/// [`sheddable_when`](Self::sheddable_when) those that can wait (reports, prefetches,
/// batch jobs). Under pressure the classes are shed from the bottom up:
///
/// - a *critical* request is admitted while any slot is free;
/// - a *normal* one only while a slot outside the critical class's
///   [`reserve`](Self::reserve) is free: critical requests in flight count against the
///   reserve first, so the reserved slots are free for critical requests whatever the
///   others do, and a normal request never takes one;
/// - a *sheddable* one on the same condition, and only while fewer than
///   [`sheddable_limit`](Self::sheddable_limit) sheddable requests are in flight (half of
///   what normal requests may use, unless set).
///
/// With 100 slots and a reserve of 20 (about a fifth, as large fleets keep for their
/// critical traffic), normal and sheddable requests together hold at most 80 slots, and
/// a critical request is admitted whenever fewer than 20 critical requests are in flight;
/// when there are more, they use the free slots outside the reserve. The ceilings hold
/// exactly however requests race: a critical or normal request is admitted with one
/// compare-and-swap, as without classes, and a sheddable one with two. A shed request of
/// any class gets the same 503 as above.
///
/// ```
/// use std::convert::Infallible;
/// use tollgate::shed::ConcurrencyShedLayer;
/// use tower::{Layer, Service, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = ConcurrencyShedLayer::new(3)
///     .critical_when(|request| request.uri.path() == "/login")
///     .reserve(1);
/// let mut service = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, Infallible>(http::Response::new(String::from("ok")))
/// }));
/// let get = |path: &str| http::Request::get(path).body(()).unwrap();
/// // Two normal requests in flight take every slot outside the reserve.
/// let mut held = Vec::new();
/// for _ in 0..2 {
///     held.push(service.ready().await.unwrap().call(get("/orders")));
/// }
/// let shed = service.ready().await.unwrap().call(get("/orders")).await.unwrap();
/// assert_eq!(shed.status(), 503);
/// // The last slot is the reserve's, and a login gets it.
/// let login = service.ready().await.unwrap().call(get("/login")).await.unwrap();
/// assert_eq!(login.status(), 200);
/// # drop(held);
/// # }
/// ```
///
/// # Metrics
///
/// | name | type | labels | meaning |
/// |---|---|---|---|
/// | `tollgate_shed_total` | counter | `layer`, `class` | requests answered 503 because too many were in flight for their class; `class` is `critical`, `normal` or `sheddable` |
/// | `tollgate_in_flight` | gauge | `layer` | requests holding a slot, of every class |
///
/// `layer` is the [name](Self::name) given to the layer, `"shed"` unless set. A layer
/// without [priority classes](#priority-classes) counts every shed request as `normal`.
/// Shed requests are also logged as `tracing` events at debug level, with their class.
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
    reserve: usize,
    sheddable_limit: Option<usize>,
    retry_after_secs: u64,
    name: Arc<str>,
    classifiers: Classifiers,
    counts: Arc<Counts>,
}

impl ConcurrencyShedLayer {
    /// A layer that lets at most `max_in_flight` requests through at once and sheds the
    /// others. With 0 it sheds every request; more than `u32::MAX` is taken as that.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// let layer = ConcurrencyShedLayer::new(64);
    /// assert_eq!(layer.max_in_flight(), 64);
    /// assert_eq!(layer.in_flight(), 0);
    /// assert_eq!(ConcurrencyShedLayer::new(usize::MAX).max_in_flight(), u32::MAX as usize);
    /// ```
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            max_in_flight: max_in_flight.min(MAX_COUNTED),
            reserve: 0,
            sheddable_limit: None,
            retry_after_secs: 1,
            name: "shed".into(),
            classifiers: Classifiers::default(),
            counts: Arc::default(),
        }
    }

    /// Makes the requests for which `predicate` holds *critical*: they may take any free
    /// slot, the [`reserve`](Self::reserve) included (see [priority
    /// classes](#priority-classes)). It sees the request's head only, before the inner
    /// service is called; keep it cheap, it runs on every request. A request that is both
    /// critical and [sheddable](Self::sheddable_when) is critical. A later `critical_when`
    /// replaces an earlier one.
    ///
    /// Without a reserve, critical requests are admitted as normal ones are, and only
    /// counted apart in `tollgate_shed_total`.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// // Health checks and logins keep a fifth of the capacity.
    /// let layer = ConcurrencyShedLayer::new(100)
    ///     .critical_when(|request| {
    ///         matches!(request.uri.path(), "/healthz" | "/login")
    ///             || request.headers.get("x-priority").is_some_and(|v| v == "critical")
    ///     })
    ///     .reserve(100 / 5);
    /// assert!(format!("{layer:?}").contains("critical_when: true"));
    /// ```
    pub fn critical_when<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.classifiers.critical = Some(Arc::new(predicate));
        self
    }

    /// Keeps `slots` of the [`max_in_flight`](Self::max_in_flight) for [critical
    /// requests](Self::critical_when) (none by default, at most all of them): a normal or
    /// sheddable request is shed when the only free slots are reserved ones. Critical
    /// requests in flight count against the reserve before the other slots, so the reserve
    /// is only as large as needed: with 100 slots, a reserve of 20 and 5 critical requests
    /// in flight, the others may hold 80. For a share, compute it from the maximum
    /// (`max / 5` is a fifth, rounded down).
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// let layer = ConcurrencyShedLayer::new(10)
    ///     .critical_when(|request| request.uri.path() == "/login")
    ///     .reserve(2);
    /// assert!(format!("{layer:?}").contains("reserve: 2"));
    /// // More than the maximum reserves every slot.
    /// let all = ConcurrencyShedLayer::new(10).reserve(50);
    /// assert!(format!("{all:?}").contains("reserve: 10"));
    /// ```
    pub fn reserve(mut self, slots: usize) -> Self {
        self.reserve = slots.min(self.max_in_flight);
        self
    }

    /// Makes the requests for which `predicate` holds *sheddable*, the first to be shed:
    /// besides keeping off the critical class's reserve, they are admitted only while fewer
    /// than [`sheddable_limit`](Self::sheddable_limit) sheddable requests are in flight.
    /// Like [`critical_when`](Self::critical_when), it sees the request's head; a later
    /// `sheddable_when` replaces an earlier one.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// // Reports and batch clients get at most 30 of the 100 slots.
    /// let layer = ConcurrencyShedLayer::new(100)
    ///     .sheddable_when(|request| {
    ///         request.uri.path().starts_with("/reports/")
    ///             || request.headers.contains_key("x-batch-job")
    ///     })
    ///     .sheddable_limit(30);
    /// assert!(format!("{layer:?}").contains("sheddable_limit: 30"));
    /// ```
    pub fn sheddable_when<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.classifiers.sheddable = Some(Arc::new(predicate));
        self
    }

    /// The most [sheddable requests](Self::sheddable_when) in flight at once: at most what
    /// normal requests may hold (the maximum less the [`reserve`](Self::reserve)), and
    /// unset, half of that, rounded down.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    ///
    /// let layer = ConcurrencyShedLayer::new(100).reserve(20);
    /// // Half of the 80 slots outside the reserve.
    /// assert!(format!("{layer:?}").contains("sheddable_limit: 40"));
    /// let layer = layer.sheddable_limit(90);
    /// assert!(format!("{layer:?}").contains("sheddable_limit: 80"));
    /// ```
    pub fn sheddable_limit(mut self, slots: usize) -> Self {
        self.sheddable_limit = Some(slots);
        self
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
        self.counts.all()
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

impl ConcurrencyShedLayer {
    fn ceilings(&self) -> Ceilings {
        Ceilings::new(self.max_in_flight, self.reserve, self.sheddable_limit)
    }
}

impl fmt::Debug for ConcurrencyShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ceilings = self.ceilings();
        f.debug_struct("ConcurrencyShedLayer")
            .field("name", &self.name)
            .field("max_in_flight", &self.max_in_flight)
            .field("in_flight", &self.in_flight())
            .field("critical_when", &self.classifiers.critical.is_some())
            .field("reserve", &(ceilings.all - ceilings.below_critical))
            .field("sheddable_when", &self.classifiers.sheddable.is_some())
            .field("sheddable_limit", &ceilings.sheddable)
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
                self.ceilings(),
                self.retry_after_secs,
                self.counts.clone(),
                self.classifiers.clone(),
                self.name.clone(),
            ),
        )
    }
}
