//! The one future type of the store's calls and of the limiter's decisions.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The answer of a store call ([`Backend`](crate::store::Backend)'s check, refund and
/// lease) or of a decision ([`Limiter::check`](crate::Limiter::check)): ready at once, with
/// no allocation, when the answer is known without I/O (the in-process store, a cached
/// refusal), boxed when it needs I/O.
///
/// The layer takes a ready answer without polling, so an in-process decision never
/// allocates a future.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use tollgate::future::StoreFuture;
///
/// let ready: StoreFuture<u64> = StoreFuture::ready(4);
/// let boxed: StoreFuture<u64> = StoreFuture::boxed(async { 4 });
/// assert_eq!(ready.await + boxed.await, 8);
/// # }
/// ```
pub struct StoreFuture<T> {
    state: State<T>,
}

enum State<T> {
    Ready(Option<T>),
    Boxed(Pin<Box<dyn Future<Output = T> + Send>>),
}

impl<T> StoreFuture<T> {
    /// An answer already known.
    #[inline]
    pub fn ready(answer: T) -> Self {
        Self {
            state: State::Ready(Some(answer)),
        }
    }

    /// An answer that needs I/O.
    pub fn boxed(future: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            state: State::Boxed(Box::pin(future)),
        }
    }

    /// Takes the answer out without polling when it is already known.
    ///
    /// ```
    /// use tollgate::future::StoreFuture;
    /// let mut ready = StoreFuture::ready("admitted");
    /// assert_eq!(ready.try_take_ready(), Some("admitted"));
    /// let mut boxed = StoreFuture::boxed(async { "admitted" });
    /// assert_eq!(boxed.try_take_ready(), None);
    /// ```
    #[inline]
    pub fn try_take_ready(&mut self) -> Option<T> {
        self.ready_slot().and_then(Option::take)
    }

    /// Where the answer lies when it is already known (`None` inside once taken), so that
    /// it can be read in place and moved out only if needed.
    #[inline]
    pub(crate) fn ready_slot(&mut self) -> Option<&mut Option<T>> {
        match &mut self.state {
            State::Ready(answer) => Some(answer),
            State::Boxed(_) => None,
        }
    }
}

// The answer is moved out, never pinned in place, so the future is Unpin whatever `T` is.
impl<T> Unpin for StoreFuture<T> {}

impl<T> fmt::Debug for StoreFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready(Some(_)) => "ready",
            State::Ready(None) => "taken",
            State::Boxed(_) => "pending",
        };
        f.debug_struct("StoreFuture")
            .field("state", &state)
            .finish()
    }
}

impl<T> Future for StoreFuture<T> {
    type Output = T;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.get_mut().state {
            State::Ready(answer) => Poll::Ready(
                answer
                    .take()
                    .expect("StoreFuture polled after it completed"),
            ),
            State::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}
