//! The service: takes a slot for each call, or sheds it.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::future::ShedFuture;
use super::slot::Shared;
use crate::http::body::ResponseBody;

/// A service whose load a [`ConcurrencyShedLayer`](super::ConcurrencyShedLayer) sheds.
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
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

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
        self.shared.counts.all()
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
        self.shared.ceilings.all
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
            .field("max_in_flight", &self.shared.ceilings.all)
            .field("in_flight", &self.in_flight())
            .field(
                "reserve",
                &(self.shared.ceilings.all - self.shared.ceilings.below_critical),
            )
            .field("sheddable_limit", &self.shared.ceilings.sheddable)
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
        let (class, request) = self.shared.classify(request);
        match self.shared.try_acquire(class) {
            Some(slot) => ShedFuture::called(self.inner.call(request), slot),
            // The readiness the inner service reserved is kept for the next call.
            None => ShedFuture::shed(self.shared.shed(class)),
        }
    }
}
