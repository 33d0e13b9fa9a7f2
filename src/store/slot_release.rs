//! Freeing slots of requests in flight in a remote store: sent in the background, tried
//! again while the slot would still be held, and counted so a shutdown can wait for them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::store::slots::{Slot, SlotStore};

/// The first wait before a failed release is sent again; it doubles up to a third of the
/// slot's time to live.
const FIRST_RETRY: Duration = Duration::from_millis(25);

/// One layer's releases that have been sent to the store and not yet answered.
#[derive(Debug, Default)]
pub(crate) struct Releases {
    pending: AtomicUsize,
    settled: Notify,
}

/// One slot and the store that holds it.
#[derive(Clone, Debug)]
pub(crate) struct SlotId {
    pub(crate) store: Arc<dyn SlotStore>,
    pub(crate) slot: Slot,
}

impl Releases {
    /// Frees `id` in its store: at once if the store answers without I/O, else from a task
    /// on the current runtime that tries again (the connection may be being made again)
    /// until the slot would have expired anyway. Freeing a slot the store does not hold
    /// does nothing, so a release is always safe to send.
    pub(crate) fn send(self: &Arc<Self>, id: SlotId) {
        let mut release = id.store.release(&id.slot);
        if release.try_take_ready().is_some() {
            return;
        }
        // Without a runtime the release cannot be sent: the slot frees itself at its expiry.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        let pending = Pending {
            releases: self.clone(),
            name: id.slot.name.clone(),
            done: false,
        };
        runtime.spawn(async move {
            let mut pending = pending;
            let give_up = Instant::now() + id.slot.ttl;
            let mut wait = FIRST_RETRY;
            let mut attempt = Some(release);
            loop {
                let sent = attempt
                    .take()
                    .unwrap_or_else(|| id.store.release(&id.slot));
                match tokio::time::timeout_at(give_up, sent).await {
                    Ok(Ok(())) => break,
                    Ok(Err(error)) if Instant::now() + wait < give_up => {
                        tracing::debug!(layer = %id.slot.name, %error, "could not free a slot; trying again");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(id.slot.ttl / 3).max(FIRST_RETRY);
                    }
                    _ => {
                        tracing::debug!(
                            layer = %id.slot.name,
                            "could not free a slot: it frees itself at its expiry"
                        );
                        break;
                    }
                }
            }
            pending.done = true;
        });
    }

    /// Waits until every release sent so far has been answered (or given up), for at most
    /// `within`: whether none is left.
    pub(crate) async fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            // Made before the count is read, so a release that ends in between wakes it.
            let settled = self.settled.notified();
            if self.pending.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return self.pending.load(Ordering::Acquire) == 0;
            }
        }
    }
}

/// One release in progress: counted out when its task ends, however it ends.
struct Pending {
    releases: Arc<Releases>,
    name: Arc<str>,
    done: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            // The task was dropped unfinished: its runtime is shutting down.
            tracing::warn!(
                layer = %self.name,
                "a slot's release was cut short by the runtime's shutdown: it frees itself \
                 at its expiry (wait for InFlightLayer::flush before the runtime ends)"
            );
        }
        self.releases.pending.fetch_sub(1, Ordering::AcqRel);
        self.releases.settled.notify_waiters();
    }
}
