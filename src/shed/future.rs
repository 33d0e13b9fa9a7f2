//! The response future: the inner call holding its slot, or a shed answer ready at once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use super::slot::InFlight;
use crate::http::body::ResponseBody;

pin_project! {
    /// The future of [`ConcurrencyShed`](crate::shed::ConcurrencyShed)'s responses: the
    /// inner service's, holding a slot until it completes or is dropped, or a 503 that is
    /// ready at once.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::future::ShedFuture;
    /// use tollgate::shed::ConcurrencyShedLayer;
    /// use tower::{Layer, Service, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = ConcurrencyShedLayer::new(1);
    /// let mut service = layer.layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
    /// }));
    /// let future = service.call(http::Request::new(()));
    /// let _: &ShedFuture<_, String> = &future;
    /// assert_eq!(layer.in_flight(), 1);
    /// // A caller that gives up (a client that disconnects) gives its slot back.
    /// drop(future);
    /// assert_eq!(layer.in_flight(), 0);
    /// # }
    /// ```
    pub struct ShedFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Called {
            #[pin]
            future: F,
            slot: Option<InFlight>,
        },
        Shed {
            response: Option<Response<ResponseBody<B>>>,
        },
    }
}

impl<F, B> ShedFuture<F, B> {
    /// The inner service's call, holding `slot` until it completes or is dropped.
    pub(super) fn called(future: F, slot: InFlight) -> Self {
        Self {
            state: State::Called {
                future,
                slot: Some(slot),
            },
        }
    }

    /// A shed request's answer.
    pub(super) fn shed(response: Response<ResponseBody<B>>) -> Self {
        Self {
            state: State::Shed {
                response: Some(response),
            },
        }
    }
}

impl<F, B> fmt::Debug for ShedFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { slot: Some(_), .. } => "calling inner service",
            State::Called { slot: None, .. } => "done",
            State::Shed { response: Some(_) } => "shed",
            State::Shed { response: None } => "done",
        };
        f.debug_struct("ShedFuture").field("state", &state).finish()
    }
}

impl<F, B, E> Future for ShedFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future, slot } => {
                let result = ready!(future.poll(cx));
                // The response head is ready: give the slot back now, not when the
                // future is dropped, and not when the body has streamed.
                drop(slot.take());
                Poll::Ready(result.map(|response| response.map(ResponseBody::inner)))
            }
            StateProj::Shed { response } => Poll::Ready(Ok(response
                .take()
                .expect("ShedFuture polled after it completed"))),
        }
    }
}
