//! Waiting for the first of two futures, as a connection's task waits for its work or for
//! what interrupts it (a health check, an announcement, a stale map).

use std::future::Future;
use std::task::Poll;

/// Which of two futures finished first.
pub(super) enum Either<A, B> {
    First(A),
    Second(B),
}

/// Waits for the first of `first` and `second` to finish (the first wins a tie), and drops
/// the other.
pub(super) async fn race<A: Future, B: Future>(
    first: A,
    second: B,
) -> Either<A::Output, B::Output> {
    let mut first = std::pin::pin!(first);
    let mut second = std::pin::pin!(second);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = first.as_mut().poll(cx) {
            return Poll::Ready(Either::First(output));
        }
        second.as_mut().poll(cx).map(Either::Second)
    })
    .await
}
