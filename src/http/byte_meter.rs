//! Counting a response body's bytes as they are sent, and charging them to the caller when
//! the body ends or is dropped.

use crate::limiter::Limiter;
use crate::limiter::decision::Decision;
use crate::store::caller::Caller;

/// What a body sent so far, and where to settle it: the decision that admitted its request
/// (which reserved nothing, or an estimate) is settled at the bytes sent, once.
pub(crate) struct ByteMeter {
    limiter: Limiter,
    caller: Caller,
    decision: Decision,
    sent: u64,
}

impl ByteMeter {
    pub(crate) fn new(limiter: Limiter, caller: Caller, decision: Decision) -> Self {
        Self {
            limiter,
            caller,
            decision,
            sent: 0,
        }
    }

    /// Counts `bytes` more sent.
    pub(crate) fn add(&mut self, bytes: usize) {
        self.sent = self.sent.saturating_add(bytes as u64);
    }
}

impl Drop for ByteMeter {
    /// The body ended or was dropped (a client gone away): what it sent is settled. A
    /// store that answers at once settles here; a remote one from a task on the runtime,
    /// under the store timeout. Without a runtime the bytes are not charged.
    fn drop(&mut self) {
        let mut settling = self.limiter.settle(&self.caller, &self.decision, self.sent);
        if settling.try_take_ready().is_some() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // The limiter counts and logs how it ended.
            runtime.spawn(async move {
                let _ = settling.await;
            });
        }
    }
}

impl std::fmt::Debug for ByteMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteMeter")
            .field("caller", &self.caller)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}
