//! The in-process store's slots of requests in flight: one process holds them all, so a
//! slot needs no expiry (it goes when its request's guard is dropped, or with the process).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::InMemoryBackend;
use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::future::StoreFuture;
use crate::store::slots::SlotStore;

/// The slot ids held, by limit name and caller; a set is removed when its last slot is
/// freed, so only callers with requests in flight take memory.
#[derive(Debug, Default)]
pub(super) struct Slots {
    held: Mutex<Held>,
}

/// Slot ids by (limit name, caller).
type Held = HashMap<(Box<str>, CallerKey), Vec<u128>>;

impl Slots {
    fn with<T>(&self, f: impl FnOnce(&mut Held) -> T) -> T {
        f(&mut self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl SlotStore for InMemoryBackend {
    fn acquire(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        limit: u64,
        _ttl: Duration,
    ) -> StoreFuture<Result<Option<u64>, StoreError>> {
        let taken = self.shared.slots.with(|held| {
            let slots = held.entry((name.into(), caller.clone())).or_default();
            if slots.contains(&slot) {
                return Some(slots.len() as u64);
            }
            if slots.len() as u64 >= limit {
                if slots.is_empty() {
                    held.remove(&(name.into(), caller.clone()));
                }
                return None;
            }
            slots.push(slot);
            Some(slots.len() as u64)
        });
        StoreFuture::ready(Ok(taken))
    }

    fn renew(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        _ttl: Duration,
    ) -> StoreFuture<Result<bool, StoreError>> {
        let held = self.shared.slots.with(|held| {
            held.get(&(name.into(), caller.clone()))
                .is_some_and(|slots| slots.contains(&slot))
        });
        StoreFuture::ready(Ok(held))
    }

    fn release(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
    ) -> StoreFuture<Result<(), StoreError>> {
        self.shared.slots.with(|held| {
            let key = (name.into(), caller.clone());
            if let Some(slots) = held.get_mut(&key) {
                slots.retain(|&s| s != slot);
                if slots.is_empty() {
                    held.remove(&key);
                }
            }
        });
        StoreFuture::ready(Ok(()))
    }

    fn is_remote(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now<T>(mut future: StoreFuture<T>) -> T {
        future
            .try_take_ready()
            .expect("the in-process store answers at once")
    }

    #[test]
    fn slots_are_counted_per_caller_and_name_and_freed_once() {
        let store = InMemoryBackend::new();
        let ttl = Duration::from_secs(1);
        let (acme, globex) = (CallerKey::new("acme"), CallerKey::new("globex"));
        assert_eq!(now(store.acquire(&acme, "a", 1, 1, ttl)).unwrap(), Some(1));
        assert_eq!(now(store.acquire(&acme, "a", 2, 1, ttl)).unwrap(), None);
        // Another caller, another name: their own slots.
        assert_eq!(
            now(store.acquire(&globex, "a", 3, 1, ttl)).unwrap(),
            Some(1)
        );
        assert_eq!(now(store.acquire(&acme, "b", 4, 1, ttl)).unwrap(), Some(1));
        // Taking a slot already held is not a second slot.
        assert_eq!(now(store.acquire(&acme, "a", 1, 1, ttl)).unwrap(), Some(1));
        assert!(now(store.renew(&acme, "a", 1, ttl)).unwrap());
        now(store.release(&acme, "a", 1)).unwrap();
        now(store.release(&acme, "a", 1)).unwrap();
        assert!(!now(store.renew(&acme, "a", 1, ttl)).unwrap());
        assert_eq!(now(store.acquire(&acme, "a", 2, 1, ttl)).unwrap(), Some(1));
        // Nothing is kept for a caller without slots.
        now(store.release(&acme, "a", 2)).unwrap();
        now(store.release(&acme, "b", 4)).unwrap();
        now(store.release(&globex, "a", 3)).unwrap();
        assert!(store.shared.slots.with(|held| held.is_empty()));
    }
}
