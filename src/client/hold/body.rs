//! The body of a response the layer let through: the inner body, whose trailers the layer
//! reads as they arrive, since a gRPC answer that is not Trailers-Only carries its status
//! and pushback there.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::state::Partition;

pin_project! {
    /// The body of a response that went through a [`HoldBack`](crate::client::HoldBack):
    /// the inner service's body, frame for frame.
    ///
    /// When the body yields its trailers, the layer reads them for gRPC's
    /// `grpc-retry-pushback-ms`, as it reads the response's headers. A gRPC answer that is
    /// not Trailers-Only (a message or more, then the status) carries its status and
    /// pushback in the trailers, so its hold starts when they arrive, once the caller has
    /// read the body that far.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use http::{HeaderMap, Request, Response};
    /// use http_body_util::{BodyExt, Full};
    /// use tollgate::client::HoldBackLayer;
    /// use tollgate::store::ManualClock;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // A gRPC answer: a message, then trailers with RESOURCE_EXHAUSTED and a pushback.
    /// let backend = tower::service_fn(|_req: Request<()>| async {
    ///     let mut trailers = HeaderMap::new();
    ///     trailers.insert("grpc-status", "8".parse().unwrap());
    ///     trailers.insert("grpc-retry-pushback-ms", "1500".parse().unwrap());
    ///     let body = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
    ///         .with_trailers(async move { Some(Ok(trailers)) });
    ///     Ok::<_, Infallible>(Response::new(body))
    /// });
    /// let layer = HoldBackLayer::new().clock(ManualClock::new(0));
    /// let call = Request::post("http://grpc.internal/feed.Feed/Follow").body(()).unwrap();
    /// let response = layer.layer(backend).oneshot(call).await.unwrap();
    /// // Not held yet: the status is still to come.
    /// assert_eq!(layer.held_for("grpc.internal"), None);
    ///
    /// let body = response.into_body().collect().await.unwrap();
    /// assert!(body.trailers().is_some());
    /// assert_eq!(layer.held_for("grpc.internal"), Some(Duration::from_millis(1500)));
    /// # }
    /// ```
    pub struct HoldBackBody<B> {
        #[pin]
        inner: B,
        // Whose holds the trailers may lengthen; taken when they are read, so that they
        // are read once.
        partition: Option<Partition>,
    }
}

impl<B> HoldBackBody<B> {
    pub(super) fn new(inner: B, partition: Partition) -> Self {
        Self {
            inner,
            partition: Some(partition),
        }
    }

    /// The inner body.
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::HoldBackLayer;
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let backend = tower::service_fn(|_req: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new("ok"))
    /// });
    /// let response = HoldBackLayer::new().layer(backend).oneshot(Request::new(())).await.unwrap();
    /// assert_eq!(*response.body().get_ref(), "ok");
    /// # }
    /// ```
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Unwraps the inner body. Trailers read from it afterwards no longer reach the layer.
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::HoldBackLayer;
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let backend = tower::service_fn(|_req: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new("ok"))
    /// });
    /// let response = HoldBackLayer::new().layer(backend).oneshot(Request::new(())).await.unwrap();
    /// assert_eq!(response.into_body().into_inner(), "ok");
    /// # }
    /// ```
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for HoldBackBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(trailers) = frame.trailers_ref()
            && let Some(partition) = this.partition.take()
        {
            partition.observe_trailers(trailers);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug> fmt::Debug for HoldBackBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldBackBody")
            .field("inner", &self.inner)
            .field("partition", &self.partition)
            .finish()
    }
}
