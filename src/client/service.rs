//! The service: asks the window before each call whether the request goes out.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::error::BoxError;
use super::future::ClientFuture;
use super::rejection::Shared;

/// A service whose outgoing calls an [`AdaptiveThrottleLayer`](super::AdaptiveThrottleLayer)
/// throttles.
///
/// Its error is tower's boxed error (`Box<dyn Error + Send + Sync>`): a request rejected
/// locally downcasts to [`NotSent`](super::NotSent); any other error is the wrapped
/// service's own (readiness errors included), boxed. Clones share the layer's window, which
/// the layer (keep a clone of it) reads.
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
/// let throttle = AdaptiveThrottleLayer::new();
/// let client = throttle.layer(backend);
/// let response = client.oneshot(Request::new(())).await.unwrap();
/// assert_eq!(response.into_body(), "ok");
/// assert_eq!((throttle.requests(), throttle.accepts()), (1, 1));
/// # }
/// ```
pub struct AdaptiveThrottle<S> {
    inner: S,
    shared: Arc<Shared>,
}

client_service!(AdaptiveThrottle, layer: AdaptiveThrottleLayer, shared: Shared);

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AdaptiveThrottle<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ClientFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // A rejected request leaves the inner service ready (any capacity it reserved in
        // `poll_ready` serves the next call), as tower allows.
        match self.shared.admit() {
            Ok(()) => ClientFuture::counted(self.inner.call(request), self.shared.clone()),
            Err(not_sent) => ClientFuture::not_sent(not_sent),
        }
    }
}
