//! One tracked caller: its key, kept once and inline when short, and its counters' states,
//! the first inline and any others beside it.

use crate::store::algorithm::PolicyState;

/// Keys up to this many encoded bytes live inside the entry; longer ones (up to a tag and
/// [`MAX_KEY_BYTES`](crate::store::MAX_KEY_BYTES)) take one heap block. 22 keeps the key
/// as small as the boxed form it replaces.
const INLINE_KEY_BYTES: usize = 22;

/// A caller's encoded key, as the shard stores it.
pub(super) enum StoredKey {
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_BYTES],
    },
    Boxed(Box<[u8]>),
}

impl StoredKey {
    pub(super) fn new(encoded: &[u8]) -> Self {
        if encoded.len() <= INLINE_KEY_BYTES {
            let mut bytes = [0; INLINE_KEY_BYTES];
            bytes[..encoded.len()].copy_from_slice(encoded);
            StoredKey::Inline {
                // At most INLINE_KEY_BYTES.
                len: encoded.len() as u8,
                bytes,
            }
        } else {
            StoredKey::Boxed(encoded.into())
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            StoredKey::Boxed(bytes) => bytes,
        }
    }
}

/// A counter's state beyond the entry's first one.
struct Slot {
    counter: u32,
    state: PolicyState,
}

/// A tracked caller. Counters are named by their index in the shard's counter list, so an
/// entry holds no name; most limiters apply one policy, whose state sits in the entry.
pub(super) struct Entry {
    key: StoredKey,
    /// After this instant the entry's counters affect no decision.
    pub(super) idle_at_ms: u64,
    first_state: PolicyState,
    // A thin pointer (8 bytes, where a `Vec` takes 24 and a boxed slice 16): rare, and
    // every tracked caller pays for the field.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<Slot>>>,
    first_counter: u32,
    /// Seen since the eviction hand last passed, refused requests included.
    pub(super) referenced: bool,
}

impl Entry {
    /// A caller's first entry, holding one counter's state.
    pub(super) fn new(key: &[u8], counter: u32, state: PolicyState) -> Self {
        Self {
            key: StoredKey::new(key),
            idle_at_ms: 0,
            first_state: state,
            more: None,
            first_counter: counter,
            referenced: false,
        }
    }

    pub(super) fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    pub(super) fn state(&self, counter: u32) -> Option<PolicyState> {
        if self.first_counter == counter {
            return Some(self.first_state);
        }
        self.more
            .as_ref()?
            .iter()
            .find(|slot| slot.counter == counter)
            .map(|slot| slot.state)
    }

    pub(super) fn store(&mut self, counter: u32, state: PolicyState) {
        if self.first_counter == counter {
            self.first_state = state;
            return;
        }
        let more = self.more.get_or_insert_with(Default::default);
        match more.iter_mut().find(|slot| slot.counter == counter) {
            Some(slot) => slot.state = state,
            None => more.push(Slot { counter, state }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_stay_inline_and_long_ones_are_boxed() {
        let short = StoredKey::new(b"=customer-0000000001");
        assert!(matches!(short, StoredKey::Inline { .. }));
        assert_eq!(short.as_bytes(), b"=customer-0000000001");
        let long = [b'x'; 100];
        let boxed = StoredKey::new(&long);
        assert!(matches!(boxed, StoredKey::Boxed(_)));
        assert_eq!(boxed.as_bytes(), &long[..]);
    }

    #[test]
    fn counters_are_kept_apart() {
        let window = |current| PolicyState::SlidingWindow {
            window_start: 0,
            previous: 0,
            current,
        };
        let mut entry = Entry::new(b"=acme", 3, window(1));
        assert_eq!(entry.state(3), Some(window(1)));
        assert_eq!(entry.state(0), None);
        entry.store(0, window(7));
        entry.store(3, window(2));
        assert_eq!(entry.state(0), Some(window(7)));
        assert_eq!(entry.state(3), Some(window(2)));
    }
}
