//! The counter identities a shard has seen, each named in the entries by its number.

use std::collections::HashMap;
use std::sync::Arc;

/// How many of the first counters are found by a scan. A limiter has a handful, usually
/// found by one pointer comparison; every member of a nested budget brings one of its own,
/// which a scan would compare with every member met before.
const SCANNED: usize = 8;

/// The counter identities a shard has seen, numbered in the order it met them: entries
/// name a counter by its number.
#[derive(Default)]
pub(super) struct Counters {
    /// The first [`SCANNED`] names, each at its number.
    scanned: Vec<Arc<str>>,
    /// The number of every name after them. Members' names come from the caller, so the map
    /// keeps the standard library's keyed hash.
    beyond: HashMap<Arc<str>, u32>,
}

impl Counters {
    /// The number of `name`, if the shard has met it.
    #[inline]
    pub(super) fn find(&self, name: &Arc<str>) -> Option<u32> {
        if let Some(i) = self
            .scanned
            .iter()
            .position(|c| Arc::ptr_eq(c, name) || **c == **name)
        {
            return Some(i as u32);
        }
        if self.beyond.is_empty() {
            return None;
        }
        self.find_beyond(name)
    }

    /// [`find`](Self::find) past the scanned counters. Out of line: a limiter's own
    /// counters never come here.
    #[inline(never)]
    fn find_beyond(&self, name: &str) -> Option<u32> {
        self.beyond.get(name).copied()
    }

    /// The number of `name`, given it if new.
    pub(super) fn intern(&mut self, name: &Arc<str>) -> u32 {
        if let Some(i) = self.find(name) {
            return i;
        }
        let i = (self.scanned.len() + self.beyond.len()) as u32;
        if self.scanned.len() < SCANNED {
            self.scanned.push(name.clone());
        } else {
            self.beyond.insert(name.clone(), i);
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(i: usize) -> Arc<str> {
        format!("team=acme/member-{i}:per-second").into()
    }

    #[test]
    fn every_counter_keeps_its_index_past_the_scanned_ones() {
        let mut counters = Counters::default();
        let indices: Vec<u32> = (0..5_000).map(|i| counters.intern(&name(i))).collect();
        assert_eq!(indices, (0..5_000).collect::<Vec<u32>>());
        // Found again by an equal name in another allocation, as a request's own policies
        // name them; interned again, nothing is added.
        for i in [0, 7, 8, 9, 4_999] {
            assert_eq!(counters.find(&name(i)), Some(i as u32));
            assert_eq!(counters.intern(&name(i)), i as u32);
        }
        assert_eq!(counters.scanned.len(), SCANNED);
        assert_eq!(counters.beyond.len(), 5_000 - SCANNED);
        assert_eq!(counters.find(&name(5_000)), None);
    }

    #[test]
    fn few_counters_are_found_without_the_map() {
        let mut counters = Counters::default();
        for i in 0..SCANNED {
            counters.intern(&name(i));
        }
        assert!(counters.beyond.is_empty());
        assert_eq!(counters.find(&name(3)), Some(3));
        assert_eq!(counters.find(&name(SCANNED)), None);
    }
}
