//! The response future of both client layers: the inner call, whose answer the layer
//! reads when it arrives; a wait for a hold to end; or a call not sent, ready at once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::error::{BoxError, NotSent};
use super::hold::{Holds, Wait};
use super::rejection::Shared;

pin_project! {
    /// The future of the responses of both client layers,
    /// [`AdaptiveThrottle`](super::AdaptiveThrottle) and [`HoldBack`](super::HoldBack),
    /// for a service `S` called with `http::Request<B>`.
    ///
    /// It resolves to the inner service's response, or fails with tower's boxed error: a
    /// call the layer did not send holds a [`NotSent`], anything else is the inner
    /// service's error.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::client::{AdaptiveThrottleLayer, HoldBackLayer};
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
    ///
    /// let mut held = HoldBackLayer::new().layer(backend);
    /// let future: ClientFuture<_, ()> = held.ready().await.unwrap().call(Request::new(()));
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
        // Sent through an adaptive throttle, whose window counts the answer.
        Counted {
            #[pin]
            future: S::Future,
            shared: Arc<Shared>,
        },
        // Sent through a hold-back layer, which reads the answer for a wait.
        Observed {
            #[pin]
            future: S::Future,
            holds: Arc<Holds>,
            partition: Arc<str>,
        },
        // Waiting for a hold to end; boxed, so only the calls that wait pay for its size.
        Waiting {
            wait: Pin<Box<Wait<S, B>>>,
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

    /// The inner service's call, whose answer may hold `partition`.
    pub(super) fn observed(future: S::Future, holds: Arc<Holds>, partition: Arc<str>) -> Self {
        Self {
            kind: Kind::Observed {
                future,
                holds,
                partition,
            },
        }
    }

    /// A call waiting for its partition's hold to end.
    pub(super) fn waiting(wait: Pin<Box<Wait<S, B>>>) -> Self {
        Self {
            kind: Kind::Waiting { wait },
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
            Kind::Counted { .. } | Kind::Observed { .. } => "calling inner service",
            Kind::Waiting { .. } => "waiting for the hold to end",
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

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().kind.project() {
                KindProj::Counted { future, shared } => {
                    let result = ready!(future.poll(cx));
                    if let Ok(response) = &result
                        && shared.is_accepted(response.status())
                    {
                        shared.record_accept();
                    }
                    return Poll::Ready(result.map_err(Into::into));
                }
                KindProj::Observed {
                    future,
                    holds,
                    partition,
                } => {
                    let result = ready!(future.poll(cx));
                    if let Ok(response) = &result {
                        holds.observe(partition, response.status(), response.headers());
                    }
                    return Poll::Ready(result.map_err(Into::into));
                }
                KindProj::NotSent { not_sent } => {
                    let not_sent = not_sent.take().expect("polled after completion");
                    return Poll::Ready(Err(Box::new(not_sent)));
                }
                KindProj::Waiting { wait } => match ready!(wait.as_mut().poll_call(cx)) {
                    Ok((future, holds, partition)) => Kind::Observed {
                        future,
                        holds,
                        partition,
                    },
                    Err(not_sent) => Kind::NotSent {
                        not_sent: Some(not_sent),
                    },
                },
            };
            self.as_mut().project().kind.set(next);
        }
    }
}
