//! The in-process store's slots of requests in flight: one process holds them all, so a
//! slot needs no expiry (it goes when its request's guard is dropped, or with the process).

use std::collections::HashMap;
use std::sync::Mutex;

use super::InMemoryBackend;
use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::future::StoreFuture;
use crate::store::slots::{Slot, SlotStore};

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

/// Where `slot`'s set is kept.
fn set_of(slot: &Slot) -> (Box<str>, CallerKey) {
    (slot.name.as_ref().into(), slot.caller.clone())
}

impl SlotStore for InMemoryBackend {
    fn acquire(&self, slot: &Slot, limit: u64) -> StoreFuture<Result<Option<u64>, StoreError>> {
        let taken = self.shared.slots.with(|held| {
            let slots = held.entry(set_of(slot)).or_default();
            if slots.contains(&slot.id) {
                return Some(slots.len() as u64);
            }
            if slots.len() as u64 >= limit {
                if slots.is_empty() {
                    held.remove(&set_of(slot));
                }
                return None;
            }
            slots.push(slot.id);
            Some(slots.len() as u64)
        });
        StoreFuture::ready(Ok(taken))
    }

    fn renew(&self, slot: &Slot) -> StoreFuture<Result<bool, StoreError>> {
        let held = self.shared.slots.with(|held| {
            held.get(&set_of(slot))
                .is_some_and(|slots| slots.contains(&slot.id))
        });
        StoreFuture::ready(Ok(held))
    }

    fn release(&self, slot: &Slot) -> StoreFuture<Result<(), StoreError>> {
        self.shared.slots.with(|held| {
            let key = set_of(slot);
            if let Some(slots) = held.get_mut(&key) {
                slots.retain(|&id| id != slot.id);
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
        use std::time::Duration;

        let store = InMemoryBackend::new();
        let slot = |caller: &str, name: &str, id| {
            Slot::new(CallerKey::new(caller), name, id, Duration::from_secs(1))
        };
        assert_eq!(
            now(store.acquire(&slot("acme", "a", 1), 1)).unwrap(),
            Some(1)
        );
        assert_eq!(now(store.acquire(&slot("acme", "a", 2), 1)).unwrap(), None);
        // Another caller, another name: their own slots.
        assert_eq!(
            now(store.acquire(&slot("globex", "a", 3), 1)).unwrap(),
            Some(1)
        );
        assert_eq!(
            now(store.acquire(&slot("acme", "b", 4), 1)).unwrap(),
            Some(1)
        );
        // Taking a slot already held is not a second slot.
        assert_eq!(
            now(store.acquire(&slot("acme", "a", 1), 1)).unwrap(),
            Some(1)
        );
        assert!(now(store.renew(&slot("acme", "a", 1))).unwrap());
        now(store.release(&slot("acme", "a", 1))).unwrap();
        now(store.release(&slot("acme", "a", 1))).unwrap();
        assert!(!now(store.renew(&slot("acme", "a", 1))).unwrap());
        assert_eq!(
            now(store.acquire(&slot("acme", "a", 2), 1)).unwrap(),
            Some(1)
        );
        // Nothing is kept for a caller without slots.
        now(store.release(&slot("acme", "a", 2))).unwrap();
        now(store.release(&slot("acme", "b", 4))).unwrap();
        now(store.release(&slot("globex", "a", 3))).unwrap();
        assert!(store.shared.slots.with(|held| held.is_empty()));
    }
}
