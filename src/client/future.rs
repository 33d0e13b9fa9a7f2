//! The response future of the adaptive throttle: the inner call, whose answer the
//! throttle's window counts when it arrives, or a call not sent, ready at once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::error::{BoxError, NotSent};
use super::rejection::Shared;

pin_project! {
    /// The future of [`AdaptiveThrottle`](super::AdaptiveThrottle)'s responses, for a
    /// service `S` called with `http::Request<B>`. ([`HoldBack`](super::HoldBack)'s is
    /// [`HoldBackFuture`](crate::future::HoldBackFuture), whose response body reads the
    /// trailers.)
    ///
    /// It resolves to the inner service's response, or fails with tower's boxed error: a
    /// call the layer did not send holds a [`NotSent`], anything else is the inner
    /// service's error.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::client::AdaptiveThrottleLayer;
    /// use tollgate::future::ClientFuture;
    /// use tower::{Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let backend = tower::service_fn(|_req: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(()))
    /// });
    /// let mut throttled = AdaptiveThrottleLayer::new().layer(backend);
    /// let future: ClientFuture<_, ()> = throttled.ready().await.unwrap().call(Request::new(()));
    /// assert_eq!(future.await.unwrap().status(), 200);
    /// # }
    /// ```
    pub struct ClientFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        kind: Kind<S, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, B>
    where
        S: Service<Request<B>>,
    {
        // Sent; the window counts the answer.
        Counted {
            #[pin]
            future: S::Future,
            shared: Arc<Shared>,
        },
        NotSent {
            not_sent: Option<NotSent>,
        },
    }
}

impl<S, B> ClientFuture<S, B>
where
    S: Service<Request<B>>,
{
    /// The inner service's call, whose answer the throttle's window counts.
    pub(super) fn counted(future: S::Future, shared: Arc<Shared>) -> Self {
        Self {
            kind: Kind::Counted { future, shared },
        }
    }

    /// A call not sent.
    pub(super) fn not_sent(not_sent: NotSent) -> Self {
        Self {
            kind: Kind::NotSent {
                not_sent: Some(not_sent),
            },
        }
    }
}

impl<S, B> fmt::Debug for ClientFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Counted { .. } => "calling inner service",
            Kind::NotSent { .. } => "not sent",
        };
        f.debug_struct("ClientFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, B, ResBody> Future for ClientFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Counted { future, shared } => {
                let result = ready!(future.poll(cx));
                if let Ok(response) = &result
                    && shared.is_accepted(response.status())
                {
                    shared.record_accept();
                }
                Poll::Ready(result.map_err(Into::into))
            }
            KindProj::NotSent { not_sent } => {
                let not_sent = not_sent.take().expect("polled after completion");
                Poll::Ready(Err(Box::new(not_sent)))
            }
        }
    }
}
