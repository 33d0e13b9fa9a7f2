//! The tower service that the layer wraps around an inner service.

use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use crate::http::body_shape::{BodyShape, Wrapped};
use crate::http::config::Config;
use crate::http::future::ResponseFuture;
use crate::http::key::AsyncKeyExtractor;

/// A service rate-limited by a [`RateLimitLayer`](crate::RateLimitLayer).
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
///     .build();
/// let service = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(limiter).key(Caller::new("*")))
///     .service_fn(|_req: http::Request<()>| async {
///         Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("hello"))))
///     });
/// let first = service.clone().oneshot(http::Request::new(())).await.unwrap();
/// let second = service.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(first.status(), 200);
/// assert_eq!(second.status(), 429);
/// # }
/// ```
#[derive(Debug)]
pub struct RateLimit<S, K, Shape = Wrapped> {
    inner: S,
    config: Arc<Config<K>>,
    shape: PhantomData<fn() -> Shape>,
}

impl<S, K, Shape> RateLimit<S, K, Shape> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<K>>) -> Self {
        Self {
            inner,
            config,
            shape: PhantomData,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, Shape> Clone for RateLimit<S, K, Shape> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
            shape: PhantomData,
        }
    }
}

impl<S, K, Shape, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, Shape>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: AsyncKeyExtractor,
    Shape: BodyShape<ResBody>,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Response = Response<Shape::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, K, ReqBody, Shape>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // A request read by a predicate is taken apart and put together again: kept out of
        // line, so that the usual request is not copied for it.
        if self.config.skip.is_some() || self.config.cost.is_some() {
            return call_read(self, request);
        }
        // A decision that takes a while takes the service driven to readiness along, and
        // leaves a fresh clone here.
        ResponseFuture::new(request, &mut self.inner, &self.config, 1)
    }
}

/// `call` for a layer whose skip predicate or cost reads the request.
#[inline(never)]
fn call_read<S, K, Shape, ReqBody, ResBody>(
    service: &mut RateLimit<S, K, Shape>,
    request: Request<ReqBody>,
) -> ResponseFuture<S, K, ReqBody, Shape>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: AsyncKeyExtractor,
{
    // The predicates read the parts only, whatever the body type.
    let (parts, body) = request.into_parts();
    if let Some(skip) = &service.config.skip
        && (skip.predicate)(&parts)
    {
        skip.counter.increment(1);
        let future = service.inner.call(Request::from_parts(parts, body));
        return ResponseFuture::skipped(future, &service.config);
    }
    let cost = service
        .config
        .cost
        .as_ref()
        .map_or(1, |units| (units.0)(&parts));
    ResponseFuture::new(
        Request::from_parts(parts, body),
        &mut service.inner,
        &service.config,
        cost,
    )
}
