//! The guard that holds one slot of a request in flight while its request runs, and the
//! count of the slots each caller holds through one instance's layer.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::caller::CallerKey;
use crate::store::slot_release::{Releases, SlotId};

/// How many slots each caller holds through one instance's layer, whether the store or
/// the local share granted them: where a local share starts when the store goes away
/// (the requests still running count against it), and its whole count while it is down.
#[derive(Debug, Default)]
pub(crate) struct HeldHere {
    counts: Mutex<HashMap<CallerKey, u64>>,
}

impl HeldHere {
    /// Counts one more slot of `caller`, if it holds fewer than `share` (any number
    /// without a share).
    pub(crate) fn take(&self, caller: &CallerKey, share: Option<u64>) -> Option<u64> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let held = counts.entry(caller.clone()).or_default();
        if share.is_some_and(|share| *held >= share) {
            if *held == 0 {
                counts.remove(caller);
            }
            return None;
        }
        *held += 1;
        Some(*held)
    }

    fn give_back(&self, caller: &CallerKey) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = counts.get_mut(caller) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                counts.remove(caller);
            }
        }
    }
}

/// One slot held while a request runs: renewed in the store in the background (a remote
/// store's, every third of its time to live), and freed when dropped, which the layer's
/// body does when the response ends or is dropped, so an error, a panic or a client gone
/// away frees it too.
pub(crate) struct HeldSlot {
    here: Arc<HeldHere>,
    caller: CallerKey,
    in_store: Option<InStore>,
    on_release: Option<Box<dyn Fn() + Send + Sync>>,
}

struct InStore {
    id: SlotId,
    releases: Arc<Releases>,
    renewal: Option<tokio::task::JoinHandle<()>>,
}

impl HeldSlot {
    /// A slot the local share granted: counted in `here` only.
    pub(crate) fn local(here: Arc<HeldHere>, caller: CallerKey) -> Self {
        Self {
            here,
            caller,
            in_store: None,
            on_release: None,
        }
    }

    /// The slot `id` that its store granted (and `here` counted), renewed every third of
    /// its time to live if the store is remote and a Tokio runtime runs, and freed through
    /// `releases`.
    pub(crate) fn in_store(here: Arc<HeldHere>, id: SlotId, releases: Arc<Releases>) -> Self {
        let renewal = id
            .store
            .is_remote()
            .then(|| tokio::runtime::Handle::try_current().ok())
            .flatten()
            .map(|runtime| runtime.spawn(renew_while_held(id.clone())));
        Self {
            here,
            caller: id.slot.caller.clone(),
            in_store: Some(InStore {
                id,
                releases,
                renewal,
            }),
            on_release: None,
        }
    }

    /// Runs `f` when the slot is freed (the layer's gauge of slots held).
    pub(crate) fn on_release(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_release = Some(Box::new(f));
        self
    }
}

/// Renews a slot until the task is aborted (the slot freed), or the store says it no
/// longer holds it. A failed renewal is tried again at the next period: the slot lives
/// until its expiry meanwhile.
async fn renew_while_held(id: SlotId) {
    let period = (id.slot.ttl / 3).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(period).await;
        match id.store.renew(&id.slot).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    layer = %id.slot.name,
                    "a request in flight lost its slot: it was not renewed within its time to live"
                );
                return;
            }
            Err(error) => {
                tracing::debug!(layer = %id.slot.name, %error, "could not renew a slot; trying again");
            }
        }
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.here.give_back(&self.caller);
        if let Some(f) = &self.on_release {
            f();
        }
        let Some(mut held) = self.in_store.take() else {
            return;
        };
        if let Some(renewal) = held.renewal.take() {
            renewal.abort();
        }
        held.releases.send(held.id);
    }
}

impl fmt::Debug for HeldSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldSlot")
            .field("caller", &self.caller)
            .field("in_store", &self.in_store.is_some())
            .finish()
    }
}
