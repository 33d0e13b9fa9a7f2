//! The response future of a hold-back layer: the inner call, whose answer the layer reads
//! when it arrives; a wait for a hold to end; or a call not sent, ready at once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::HoldBackBody;
use super::state::Partition;
use super::wait::Wait;
use crate::client::error::{BoxError, NotSent};

pin_project! {
    /// The future of [`HoldBack`](crate::client::HoldBack)'s responses, for a service `S`
    /// called with `http::Request<B>`.
    ///
    /// It resolves to the inner service's response, its body wrapped in a
    /// [`HoldBackBody`](crate::client::HoldBackBody) that reads its trailers, or fails with
    /// tower's boxed error: a call the layer did not send holds a
    /// [`NotSent`](crate::client::NotSent), anything else is the inner service's error.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::client::HoldBackLayer;
    /// use tollgate::future::HoldBackFuture;
    /// use tower::{Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let backend = tower::service_fn(|_req: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(()))
    /// });
    /// let mut held = HoldBackLayer::new().layer(backend);
    /// let future: HoldBackFuture<_, ()> = held.ready().await.unwrap().call(Request::new(()));
    /// assert_eq!(future.await.unwrap().status(), 200);
    /// # }
    /// ```
    pub struct HoldBackFuture<S, B>
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
        // Sent; the partition reads the answer, and then its body's trailers.
        Sent {
            #[pin]
            future: S::Future,
            partition: Option<Partition>,
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

impl<S, B> HoldBackFuture<S, B>
where
    S: Service<Request<B>>,
{
    /// The inner service's call, whose answer may hold `partition`.
    pub(super) fn sent(future: S::Future, partition: Partition) -> Self {
        Self {
            kind: Kind::Sent {
                future,
                partition: Some(partition),
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

impl<S, B> fmt::Debug for HoldBackFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Sent { .. } => "calling inner service",
            Kind::Waiting { .. } => "waiting for the hold to end",
            Kind::NotSent { .. } => "not sent",
        };
        f.debug_struct("HoldBackFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, B, ResBody> Future for HoldBackFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<HoldBackBody<ResBody>>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().kind.project() {
                KindProj::Sent { future, partition } => {
                    let response = ready!(future.poll(cx)).map_err(Into::into)?;
                    let partition = partition.take().expect("polled after completion");
                    partition.observe(response.status(), response.headers());
                    return Poll::Ready(
                        Ok(response.map(|body| HoldBackBody::new(body, partition))),
                    );
                }
                KindProj::NotSent { not_sent } => {
                    let not_sent = not_sent.take().expect("polled after completion");
                    return Poll::Ready(Err(Box::new(not_sent)));
                }
                KindProj::Waiting { wait } => match ready!(wait.as_mut().poll_call(cx)) {
                    Ok((future, partition)) => Kind::Sent {
                        future,
                        partition: Some(partition),
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
