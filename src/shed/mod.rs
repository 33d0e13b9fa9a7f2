//! Load shedding by concurrency: a layer that needs no store.
//!
//! When more requests are in flight through the layer than it allows, a new one is
//! answered at once with 503, `Retry-After` and the temporary-reduced-capacity problem,
//! instead of queueing behind the others.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use metrics::{Key, Label, Level, Metadata};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::http::body::ResponseBody;
use crate::http::response;

/// Counted each time the layer sheds a request, labelled `layer`.
const SHED_TOTAL: &str = "tollgate_shed_total";
/// Requests in flight through the layer, labelled `layer`.
const IN_FLIGHT: &str = "tollgate_in_flight";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

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
        let labels = vec![Label::new("layer", self.name.clone())];
        ConcurrencyShed {
            inner,
            shared: Arc::new(Shared {
                max_in_flight: self.max_in_flight,
                retry_after_secs: self.retry_after_secs,
                in_flight: self.in_flight.clone(),
                shed_key: Key::from_parts(SHED_TOTAL, labels.clone()),
                in_flight_key: Key::from_parts(IN_FLIGHT, labels),
                name: self.name.clone(),
            }),
        }
    }
}

/// What every service made by one [`ConcurrencyShedLayer::layer`] call shares.
struct Shared {
    max_in_flight: usize,
    retry_after_secs: u64,
    /// Shared further, with the layer and every other service it made.
    in_flight: Arc<AtomicUsize>,
    /// Metric keys built once, so that counting allocates nothing per request.
    shed_key: Key,
    in_flight_key: Key,
    name: Arc<str>,
}

impl Shared {
    /// Takes a slot if one is free.
    fn try_acquire(self: &Arc<Self>) -> Option<InFlight> {
        // The count guards no other data: Relaxed is enough, and the compare-and-swap
        // loop never lets it pass the maximum, even for an instant.
        self.in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_in_flight).then_some(n + 1)
            })
            .ok()?;
        metrics::with_recorder(|recorder| {
            recorder
                .register_gauge(&self.in_flight_key, &METADATA)
                .increment(1.0);
        });
        Some(InFlight {
            shared: self.clone(),
        })
    }

    fn shed<B>(&self) -> Response<ResponseBody<B>> {
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&self.shed_key, &METADATA)
                .increment(1);
        });
        tracing::debug!(
            layer = %self.name,
            max_in_flight = self.max_in_flight,
            "shed a request: too many in flight"
        );
        response::unavailable(StatusCode::SERVICE_UNAVAILABLE, self.retry_after_secs)
    }
}

/// A slot taken; dropping it gives the slot back.
struct InFlight {
    shared: Arc<Shared>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        metrics::with_recorder(|recorder| {
            recorder
                .register_gauge(&self.shared.in_flight_key, &METADATA)
                .decrement(1.0);
        });
    }
}

/// A service whose load a [`ConcurrencyShedLayer`] sheds.
///
/// Its responses are `Response<ResponseBody<B>>` around the inner service's body `B`, as
/// with [`RateLimit`](crate::RateLimit); its error is the inner service's.
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use tollgate::shed::ConcurrencyShedLayer;
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut service = ServiceBuilder::new()
///     .layer(ConcurrencyShedLayer::new(1))
///     .service_fn(|_req: http::Request<()>| async {
///         Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("hello"))))
///     });
/// // The first request holds the only slot until its future completes or is dropped.
/// let first = service.ready().await.unwrap().call(http::Request::new(()));
/// assert_eq!(service.in_flight(), 1);
/// let second = service.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// assert_eq!(second.status(), 503);
/// assert_eq!(second.headers()["retry-after"], "1");
/// assert_eq!(first.await.unwrap().status(), 200);
/// assert_eq!(service.in_flight(), 0);
/// let third = service.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(third.status(), 200);
/// # }
/// ```
pub struct ConcurrencyShed<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> ConcurrencyShed<S> {
    /// The wrapped service.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    /// use tower::Layer;
    ///
    /// let service = ConcurrencyShedLayer::new(8).layer("inner");
    /// assert_eq!(*service.get_ref(), "inner");
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    /// use tower::Layer;
    ///
    /// let mut service = ConcurrencyShedLayer::new(8).layer(1);
    /// *service.get_mut() += 1;
    /// assert_eq!(*service.get_ref(), 2);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    /// use tower::Layer;
    ///
    /// let service = ConcurrencyShedLayer::new(8).layer("inner");
    /// assert_eq!(service.into_inner(), "inner");
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The requests in flight now, through every service the layer wraps.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    /// use tower::Layer;
    ///
    /// let layer = ConcurrencyShedLayer::new(8);
    /// let service = layer.layer(());
    /// assert_eq!(service.in_flight(), layer.in_flight());
    /// ```
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The most requests let through at once.
    ///
    /// ```
    /// use tollgate::shed::ConcurrencyShedLayer;
    /// use tower::Layer;
    ///
    /// assert_eq!(ConcurrencyShedLayer::new(8).layer(()).max_in_flight(), 8);
    /// ```
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight
    }
}

impl<S: Clone> Clone for ConcurrencyShed<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for ConcurrencyShed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyShed")
            .field("inner", &self.inner)
            .field("name", &self.shared.name)
            .field("max_in_flight", &self.shared.max_in_flight)
            .field("in_flight", &self.in_flight())
            .field("retry_after_secs", &self.shared.retry_after_secs)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyShed<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ShedFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match self.shared.try_acquire() {
            Some(slot) => ShedFuture {
                state: State::Called {
                    future: self.inner.call(request),
                    slot: Some(slot),
                },
            },
            // The readiness the inner service reserved is kept for the next call.
            None => ShedFuture {
                state: State::Shed {
                    response: Some(self.shared.shed()),
                },
            },
        }
    }
}

pin_project! {
    /// The future of [`ConcurrencyShed`]'s responses: the inner service's, holding a
    /// slot until it completes or is dropped, or a 503 that is ready at once.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::future::ShedFuture;
    /// use tollgate::shed::ConcurrencyShedLayer;
    /// use tower::{Layer, Service, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = ConcurrencyShedLayer::new(1);
    /// let mut service = layer.layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
    /// }));
    /// let future = service.call(http::Request::new(()));
    /// let _: &ShedFuture<_, String> = &future;
    /// assert_eq!(layer.in_flight(), 1);
    /// // A caller that gives up (a client that disconnects) gives its slot back.
    /// drop(future);
    /// assert_eq!(layer.in_flight(), 0);
    /// # }
    /// ```
    pub struct ShedFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Called {
            #[pin]
            future: F,
            slot: Option<InFlight>,
        },
        Shed {
            response: Option<Response<ResponseBody<B>>>,
        },
    }
}

impl<F, B> fmt::Debug for ShedFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { slot: Some(_), .. } => "calling inner service",
            State::Called { slot: None, .. } => "done",
            State::Shed { response: Some(_) } => "shed",
            State::Shed { response: None } => "done",
        };
        f.debug_struct("ShedFuture").field("state", &state).finish()
    }
}

impl<F, B, E> Future for ShedFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future, slot } => {
                let result = ready!(future.poll(cx));
                // The response head is ready: give the slot back now, not when the
                // future is dropped, and not when the body has streamed.
                drop(slot.take());
                Poll::Ready(result.map(|response| response.map(ResponseBody::inner)))
            }
            StateProj::Shed { response } => Poll::Ready(Ok(response
                .take()
                .expect("ShedFuture polled after it completed"))),
        }
    }
}
