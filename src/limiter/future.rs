//! The future of one decision.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::limiter::decision::Decision;

/// Resolves to the [`Decision`] for one request: at once for an in-process store or a
/// cached refusal, after the store's answer (or its timeout) otherwise.
pub struct DecisionFuture {
    state: DecisionState,
}

enum DecisionState {
    Ready(Option<Decision>),
    Pending(Pin<Box<dyn Future<Output = Decision> + Send>>),
}

impl DecisionFuture {
    pub(super) fn ready(decision: Decision) -> Self {
        Self {
            state: DecisionState::Ready(Some(decision)),
        }
    }

    /// The decision, when it is known without waiting.
    pub(crate) fn try_take_ready(&mut self) -> Option<Decision> {
        match &mut self.state {
            DecisionState::Ready(decision) => decision.take(),
            DecisionState::Pending(_) => None,
        }
    }

    pub(super) fn boxed(future: impl Future<Output = Decision> + Send + 'static) -> Self {
        Self {
            state: DecisionState::Pending(Box::pin(future)),
        }
    }
}

impl fmt::Debug for DecisionFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            DecisionState::Ready(decision) => f.debug_tuple("Ready").field(decision).finish(),
            DecisionState::Pending(_) => f.write_str("Pending"),
        }
    }
}

impl Future for DecisionFuture {
    type Output = Decision;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match &mut self.state {
            DecisionState::Ready(decision) => Poll::Ready(
                decision
                    .take()
                    .expect("DecisionFuture polled after it completed"),
            ),
            DecisionState::Pending(future) => future.as_mut().poll(cx),
        }
    }
}
