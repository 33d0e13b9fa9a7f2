//! The service: looks up the request's partition before each call.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::HoldBackBody;
use super::future::HoldBackFuture;
use super::state::{Partition, Shared};
use super::wait::Wait;
use crate::client::error::{BoxError, NotSent};

/// A service whose calls a [`HoldBackLayer`](super::HoldBackLayer) holds back while their
/// partition's server has said to wait. Clones share the layer's holds. Its responses'
/// bodies are [`HoldBackBody`](crate::client::HoldBackBody)s, which read the trailers.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use tollgate::client::HoldBackLayer;
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let backend = tower::service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new("ok")) });
/// let client = HoldBackLayer::new().layer(backend);
/// let response = client.oneshot(Request::get("http://a.example/").body(()).unwrap()).await.unwrap();
/// assert_eq!(response.into_body().into_inner(), "ok");
/// # }
/// ```
pub struct HoldBack<S> {
    inner: S,
    shared: Arc<Shared>,
}

client_service!(HoldBack, layer: HoldBackLayer, shared: Shared);

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for HoldBack<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<HoldBackBody<ResBody>>;
    type Error = BoxError;
    type Future = HoldBackFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let partition: Arc<str> = (self.shared.config.partition)(&parts).into();
        let request = Request::from_parts(parts, body);
        let now = self.shared.now_ms();
        let Some(hold) = self.shared.hold(&partition, now) else {
            let future = self.inner.call(request);
            return HoldBackFuture::sent(future, Partition::new(self.shared.clone(), partition));
        };
        let remaining = hold.until_ms - now;
        let max_wait = u64::try_from(self.shared.config.max_wait.as_millis()).unwrap_or(u64::MAX);
        if remaining > max_wait {
            // A rejected call leaves the inner service ready (any capacity it reserved in
            // `poll_ready` serves the next call), as tower allows.
            self.shared.count(hold.reason, "failed");
            return HoldBackFuture::not_sent(NotSent::held(
                partition,
                hold.reason,
                std::time::Duration::from_millis(remaining),
            ));
        }
        // The ready service goes with the waiting call, which calls it once the hold is
        // over; this service continues with a clone, made ready again by its caller.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        HoldBackFuture::waiting(Wait::new(
            ready,
            request,
            self.shared.clone(),
            partition,
            hold,
            now.saturating_add(max_wait),
        ))
    }
}
