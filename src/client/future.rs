//! The response future: the inner call, counted when it answers, or a local rejection.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::error::{BoxError, NotSent};
use super::rejection::Shared;

pin_project! {
    /// The future of [`AdaptiveThrottle`]'s responses: the inner call, whose response is
    /// counted as accepted or not when it arrives, or a local rejection, ready at once.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tollgate::client::AdaptiveThrottleFuture;
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
            not_sent: Option<NotSent>,
        },
    }
}

impl<F> AdaptiveThrottleFuture<F> {
    /// The inner service's call, whose answer `shared` counts.
    pub(super) fn called(future: F, shared: Arc<Shared>) -> Self {
        Self {
            kind: Kind::Called { future, shared },
        }
    }

    /// A request rejected locally.
    pub(super) fn throttled(not_sent: NotSent) -> Self {
        Self {
            kind: Kind::Throttled {
                not_sent: Some(not_sent),
            },
        }
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
    E: Into<BoxError>,
{
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, shared } => {
                let result = ready!(future.poll(cx));
                if let Ok(response) = &result
                    && shared.is_accepted(response.status())
                {
                    shared.record_accept();
                }
                Poll::Ready(result.map_err(Into::into))
            }
            KindProj::Throttled { not_sent } => {
                let not_sent = not_sent.take().expect("polled after completion");
                Poll::Ready(Err(Box::new(not_sent)))
            }
        }
    }
}
