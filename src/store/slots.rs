//! Slots of requests in flight: what a store must do to bound a caller's concurrent
//! requests across instances.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::future::StoreFuture;

/// A store of slots for requests in flight, one set per caller and limit name: what
/// [`InFlightLayer`](crate::in_flight::InFlightLayer) asks before it lets a request run
/// and tells when the request is over.
///
/// A slot is taken for `ttl` and renewed while its request runs; a slot whose holder
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
/// use tollgate::store::{CallerKey, SlotStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = InMemoryBackend::new();
/// let acme = CallerKey::new("acme");
/// let ttl = Duration::from_secs(10);
/// assert_eq!(store.acquire(&acme, "reports", 1, 2, ttl).await.unwrap(), Some(1));
/// assert_eq!(store.acquire(&acme, "reports", 2, 2, ttl).await.unwrap(), Some(2));
/// // Both slots are held: a third request of acme waits for one of them.
/// assert_eq!(store.acquire(&acme, "reports", 3, 2, ttl).await.unwrap(), None);
/// store.release(&acme, "reports", 1).await.unwrap();
/// assert_eq!(store.acquire(&acme, "reports", 3, 2, ttl).await.unwrap(), Some(2));
/// # }
/// ```
pub trait SlotStore: Send + Sync + fmt::Debug + 'static {
    /// Takes slot `slot` of `caller`'s slots named `name` for `ttl`, if fewer than `limit`
    /// are held (slots past their expiry are not): `Some` with the count held after it,
    /// or `None` when all `limit` are taken.
    fn acquire(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        limit: u64,
        ttl: Duration,
    ) -> StoreFuture<Result<Option<u64>, StoreError>>;

    /// Extends slot `slot` for another `ttl` from now: `false` if the store no longer
    /// holds it (it expired unrenewed, and may have gone to another request).
    fn renew(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        ttl: Duration,
    ) -> StoreFuture<Result<bool, StoreError>>;

    /// Frees slot `slot` (nothing happens if the store no longer holds it).
    fn release(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
    ) -> StoreFuture<Result<(), StoreError>>;

    /// Whether calls cross a network (default `true`): a remote store's slots are renewed
    /// while their requests run, and each call is bounded by the layer's store timeout.
    fn is_remote(&self) -> bool {
        true
    }
}

impl<S: SlotStore + ?Sized> SlotStore for Arc<S> {
    fn acquire(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        limit: u64,
        ttl: Duration,
    ) -> StoreFuture<Result<Option<u64>, StoreError>> {
        (**self).acquire(caller, name, slot, limit, ttl)
    }

    fn renew(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        ttl: Duration,
    ) -> StoreFuture<Result<bool, StoreError>> {
        (**self).renew(caller, name, slot, ttl)
    }

    fn release(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
    ) -> StoreFuture<Result<(), StoreError>> {
        (**self).release(caller, name, slot)
    }

    fn is_remote(&self) -> bool {
        (**self).is_remote()
    }
}
