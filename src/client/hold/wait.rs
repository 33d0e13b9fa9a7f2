//! A call waiting for its partition's hold to end, within what it may wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::Request;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::state::{Partition, Shared};
use super::table::Hold;
use crate::client::error::NotSent;

pin_project! {
    /// A ready service and the request it will be called with once the hold on `partition`
    /// is over, unless the hold lasts past `deadline_ms`. Kept in one box per waiting call
    /// (the sleep included), so the response future stays small for the calls that do not
    /// wait.
    pub(super) struct Wait<S, B> {
        #[pin]
        sleep: Sleep,
        service: Option<S>,
        request: Option<Request<B>>,
        shared: Arc<Shared>,
        partition: Arc<str>,
        hold: Hold,
        deadline_ms: u64,
    }
}

/// A call made once its wait was over: the inner future, and what reads its answer.
pub(super) type Sent<F> = (F, Partition);

impl<S, B> Wait<S, B> {
    pub(super) fn new(
        service: S,
        request: Request<B>,
        shared: Arc<Shared>,
        partition: Arc<str>,
        hold: Hold,
        deadline_ms: u64,
    ) -> Pin<Box<Self>> {
        let now = shared.now_ms();
        let sleep = tokio::time::sleep(Duration::from_millis(hold.until_ms.saturating_sub(now)));
        Box::pin(Self {
            sleep,
            service: Some(service),
            request: Some(request),
            shared,
            partition,
            hold,
            deadline_ms,
        })
    }

    /// Ready when the hold is over (the call, made) or would end past the deadline (the
    /// call, not sent). A hold lengthened within the deadline is waited for again.
    pub(super) fn poll_call(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Sent<S::Future>, NotSent>>
    where
        S: Service<Request<B>>,
    {
        let mut this = self.project();
        loop {
            ready!(this.sleep.as_mut().poll(cx));
            let now = this.shared.now_ms();
            match this.shared.hold(this.partition, now) {
                Some(longer) if longer.until_ms <= *this.deadline_ms => {
                    this.sleep.as_mut().reset(
                        tokio::time::Instant::now() + Duration::from_millis(longer.until_ms - now),
                    );
                }
                Some(longer) => {
                    this.shared.count(longer.reason, "failed");
                    return Poll::Ready(Err(NotSent::held(
                        this.partition.clone(),
                        longer.reason,
                        Duration::from_millis(longer.until_ms - now),
                    )));
                }
                None => {
                    this.shared.count(this.hold.reason, "waited");
                    let mut service = this.service.take().expect("polled after completion");
                    let request = this.request.take().expect("polled after completion");
                    let future = service.call(request);
                    let partition = Partition::new(this.shared.clone(), this.partition.clone());
                    return Poll::Ready(Ok((future, partition)));
                }
            }
        }
    }
}
