//! The response future: the inner call, whose answer may hold the partition; a wait for a
//! hold to end; or a call held back, ready at once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::state::{Hold, Shared};
use crate::client::error::{BoxError, NotSent};

pin_project! {
    /// The future of [`HoldBack`](super::HoldBack)'s responses.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::client::{HoldBackFuture, HoldBackLayer};
    /// use tower::{Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let backend = tower::service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
    /// let mut client = HoldBackLayer::new().layer(backend);
    /// let future: HoldBackFuture<_, ()> = client.ready().await.unwrap().call(Request::new(()));
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
        Called {
            #[pin]
            future: S::Future,
            shared: Arc<Shared>,
            partition: Arc<str>,
        },
        Waiting {
            sleep: Pin<Box<Sleep>>,
            service: Option<S>,
            request: Option<Request<B>>,
            shared: Arc<Shared>,
            partition: Arc<str>,
            hold: Hold,
            deadline_ms: u64,
        },
        HeldBack {
            held: Option<NotSent>,
        },
    }
}

impl<S, B> HoldBackFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(super) fn called(future: S::Future, shared: Arc<Shared>, partition: Arc<str>) -> Self {
        Self {
            kind: Kind::Called {
                future,
                shared,
                partition,
            },
        }
    }

    pub(super) fn held_back(held: NotSent) -> Self {
        Self {
            kind: Kind::HeldBack { held: Some(held) },
        }
    }

    /// `service` (ready) is called with `request` once `partition`'s hold is over, unless
    /// it lasts past `deadline_ms`.
    pub(super) fn waiting(
        service: S,
        request: Request<B>,
        shared: Arc<Shared>,
        partition: Arc<str>,
        hold: Hold,
        deadline_ms: u64,
    ) -> Self {
        let now = shared.now_ms();
        let sleep = Box::pin(tokio::time::sleep(Duration::from_millis(
            hold.until_ms.saturating_sub(now),
        )));
        Self {
            kind: Kind::Waiting {
                sleep,
                service: Some(service),
                request: Some(request),
                shared,
                partition,
                hold,
                deadline_ms,
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
            Kind::Called { .. } => "calling inner service",
            Kind::Waiting { .. } => "waiting for the hold to end",
            Kind::HeldBack { .. } => "held back",
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
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().kind.project() {
                KindProj::Called {
                    future,
                    shared,
                    partition,
                } => {
                    let result = ready!(future.poll(cx));
                    if let Ok(response) = &result {
                        shared.observe(partition, response.status(), response.headers());
                    }
                    return Poll::Ready(result.map_err(Into::into));
                }
                KindProj::HeldBack { held } => {
                    let held = held.take().expect("polled after completion");
                    return Poll::Ready(Err(Box::new(held)));
                }
                KindProj::Waiting {
                    sleep,
                    service,
                    request,
                    shared,
                    partition,
                    hold,
                    deadline_ms,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let now = shared.now_ms();
                    match shared.hold(partition, now) {
                        // Lengthened while waiting, still within the deadline: wait on.
                        Some(longer) if longer.until_ms <= *deadline_ms => {
                            sleep.as_mut().reset(
                                tokio::time::Instant::now()
                                    + Duration::from_millis(longer.until_ms - now),
                            );
                            continue;
                        }
                        Some(longer) => {
                            shared.count(longer.reason, "failed");
                            Kind::HeldBack {
                                held: Some(NotSent::held(
                                    partition.clone(),
                                    longer.reason,
                                    Duration::from_millis(longer.until_ms - now),
                                )),
                            }
                        }
                        None => {
                            shared.count(hold.reason, "waited");
                            let mut service = service.take().expect("polled after completion");
                            let request = request.take().expect("polled after completion");
                            Kind::Called {
                                future: service.call(request),
                                shared: shared.clone(),
                                partition: partition.clone(),
                            }
                        }
                    }
                }
            };
            self.as_mut().project().kind.set(next);
        }
    }
}
