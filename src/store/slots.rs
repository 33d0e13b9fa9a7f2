//! Slots of requests in flight: what a store must do to bound a caller's concurrent
//! requests across instances.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::future::StoreFuture;

/// One slot of a caller's requests in flight: whose it is, the in-flight limit it counts
/// against, its id, and how long the store holds it unless it is renewed.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::{CallerKey, Slot};
///
/// let slot = Slot::new(CallerKey::new("acme"), "reports", 7, Duration::from_secs(10));
/// assert_eq!(&*slot.name, "reports");
/// assert_eq!(slot.id, 7);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Slot {
    /// The caller whose slot it is.
    pub caller: CallerKey,
    /// The in-flight limit's name: a caller has a set of slots for each.
    pub name: Arc<str>,
    /// The slot's id, chosen by whoever asks for it, unique across instances.
    pub id: u128,
    /// How long the store holds the slot when it is taken or renewed: a slot whose holder
    /// stops renewing it is free again once this has passed.
    pub ttl: Duration,
}

impl Slot {
    /// Slot `id` of `caller`'s slots of the limit `name`, held for `ttl` at a time.
    pub fn new(caller: CallerKey, name: impl Into<Arc<str>>, id: u128, ttl: Duration) -> Self {
        Self {
            caller,
            name: name.into(),
            id,
            ttl,
        }
    }
}

/// A store of slots for requests in flight, one set per caller and limit name: what
/// [`InFlightLayer`](crate::in_flight::InFlightLayer) asks before it lets a request run
/// and tells when the request is over.
///
/// A slot is taken for its `ttl` and renewed while its request runs; a slot whose holder
/// stopped renewing it (an instance that died, or lost the store) is free again once its
/// `ttl` has passed, so a crash leaks no slot for longer than that. Slot ids are chosen by
/// the caller of these methods, unique across instances.
///
/// [`InMemoryBackend`](crate::InMemoryBackend) implements it for one process,
/// `RedisBackend` (the `redis` feature) for many (a sorted set per caller, scored by each
/// slot's expiry on Redis's clock, changed by one Lua script).
///
/// ```
/// use std::time::Duration;
/// use tollgate::InMemoryBackend;
/// use tollgate::store::{CallerKey, Slot, SlotStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = InMemoryBackend::new();
/// let slot = |id| Slot::new(CallerKey::new("acme"), "reports", id, Duration::from_secs(10));
/// assert_eq!(store.acquire(&slot(1), 2).await.unwrap(), Some(1));
/// assert_eq!(store.acquire(&slot(2), 2).await.unwrap(), Some(2));
/// // Both slots are held: a third request of acme waits for one of them.
/// assert_eq!(store.acquire(&slot(3), 2).await.unwrap(), None);
/// store.release(&slot(1)).await.unwrap();
/// assert_eq!(store.acquire(&slot(3), 2).await.unwrap(), Some(2));
/// # }
/// ```
pub trait SlotStore: Send + Sync + fmt::Debug + 'static {
    /// Takes `slot` for its `ttl`, if fewer than `limit` of its caller's slots of its
    /// limit are held (slots past their expiry are not): `Some` with the count held after
    /// it, or `None` when all `limit` are taken.
    fn acquire(&self, slot: &Slot, limit: u64) -> StoreFuture<Result<Option<u64>, StoreError>>;

    /// Extends `slot` for another `ttl` from now: `false` if the store no longer holds it
    /// (it expired unrenewed, and may have gone to another request).
    fn renew(&self, slot: &Slot) -> StoreFuture<Result<bool, StoreError>>;

    /// Frees `slot` (nothing happens if the store no longer holds it).
    fn release(&self, slot: &Slot) -> StoreFuture<Result<(), StoreError>>;

    /// Whether calls cross a network (default `true`): a remote store's slots are renewed
    /// while their requests run, and each call is bounded by the layer's store timeout.
    fn is_remote(&self) -> bool {
        true
    }
}

impl<S: SlotStore + ?Sized> SlotStore for Arc<S> {
    fn acquire(&self, slot: &Slot, limit: u64) -> StoreFuture<Result<Option<u64>, StoreError>> {
        (**self).acquire(slot, limit)
    }

    fn renew(&self, slot: &Slot) -> StoreFuture<Result<bool, StoreError>> {
        (**self).renew(slot)
    }

    fn release(&self, slot: &Slot) -> StoreFuture<Result<(), StoreError>> {
        (**self).release(slot)
    }

    fn is_remote(&self) -> bool {
        (**self).is_remote()
    }
}
